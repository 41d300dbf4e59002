//! The command line (part of the binary): `spillway [--config FILE]`, `spillway check-config FILE`,
//! `spillway mock-engine [FLAGS]`, and the Dynamo-named knobs (semantics §9), each also
//! readable from its environment variable.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use spillway::Overrides;
use spillway::route::RouterMode;
use spillway::shed::Thresholds;
use spillway_mock::{MockConfig, defaults};

#[derive(Debug, Parser)]
#[command(
    name = "spillway",
    version,
    about = "Load-shedding HTTP edge proxy for LLM inference fleets"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Configuration file (TOML). Without it the embedded default (tuning/spillway.toml) runs.
    #[arg(long, short = 'c', global = true, help_heading = PROXY_OPTIONS)]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub knobs: Knobs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file and print the effective configuration (like `nginx -t`).
    CheckConfig {
        /// The file to check.
        file: PathBuf,
    },
    /// Run a simulated OpenAI-compatible inference engine (continuous batching, paged KV
    /// cache, vLLM metrics) to put behind Spillway.
    MockEngine(MockArgs),
}

/// `spillway mock-engine` flags; see [`MockConfig`] for what each one means.
#[derive(Debug, Clone, clap::Args)]
pub struct MockArgs {
    /// Address to serve on.
    #[arg(long, default_value_t = defaults::LISTEN)]
    pub listen: std::net::SocketAddr,
    /// Served model name; requests for another model get 404.
    #[arg(long, default_value = defaults::MODEL)]
    pub model: String,
    /// Seed of the generated text.
    #[arg(long, default_value_t = defaults::SEED)]
    pub seed: u64,
    /// KV-cache size in blocks (vLLM's num_gpu_blocks).
    #[arg(long, default_value_t = defaults::KV_BLOCKS)]
    pub kv_blocks: u64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = defaults::BLOCK_SIZE)]
    pub block_size: u32,
    /// Most sequences in the running batch.
    #[arg(long, default_value_t = defaults::MAX_NUM_SEQS)]
    pub max_num_seqs: u32,
    /// Token budget of one engine step (decode tokens plus prefill chunks).
    #[arg(long, default_value_t = defaults::MAX_NUM_BATCHED_TOKENS)]
    pub max_num_batched_tokens: u32,
    /// Prefill throughput in prompt tokens per second.
    #[arg(long, default_value_t = defaults::PREFILL_TOKENS_PER_S)]
    pub prefill_tokens_per_s: f64,
    /// Fixed cost of every engine step, in milliseconds.
    #[arg(long = "decode-step-ms", default_value_t = defaults::DECODE_STEP_BASE_MS)]
    pub decode_step_base_ms: f64,
    /// Added step cost per sequence in the batch, in milliseconds.
    #[arg(long, default_value_t = defaults::DECODE_STEP_PER_SEQ_MS)]
    pub decode_step_per_seq_ms: f64,
    /// max_tokens of requests that set none.
    #[arg(long, default_value_t = defaults::DEFAULT_MAX_TOKENS)]
    pub default_max_tokens: u32,
    /// Spillway admin base URL to push load events to (POST {URL}/load).
    #[arg(long, value_name = "URL")]
    pub push_load: Option<String>,
    /// worker_id in pushed events (default: the listen host:port).
    #[arg(long)]
    pub worker_name: Option<String>,
    /// How often load is pushed, in milliseconds.
    #[arg(long, default_value_t = defaults::PUSH_INTERVAL_MS)]
    pub push_interval_ms: u64,
}

impl MockArgs {
    pub fn config(&self) -> MockConfig {
        MockConfig {
            listen: self.listen,
            model: self.model.clone(),
            seed: self.seed,
            kv_blocks: self.kv_blocks,
            block_size: self.block_size,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            decode_step_base_ms: self.decode_step_base_ms,
            decode_step_per_seq_ms: self.decode_step_per_seq_ms,
            default_max_tokens: self.default_max_tokens,
            push_load: self.push_load.clone(),
            worker_name: self.worker_name.clone(),
            push_interval_ms: self.push_interval_ms,
        }
    }
}

/// Help heading of the proxy's options, which clap also lists under every subcommand.
const PROXY_OPTIONS: &str = "Proxy options";

/// Dynamo-compatible knobs: defaults for every model, below per-model keys in the file.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = PROXY_OPTIONS)]
pub struct Knobs {
    /// Busy when used KV blocks exceed this fraction of the total (0.0..=1.0).
    #[arg(long, env = "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", global = true)]
    pub active_decode_blocks_threshold: Option<f64>,
    /// Busy when active prefill tokens exceed this count.
    #[arg(long, env = "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", global = true)]
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Busy when active prefill tokens exceed this fraction of max_num_batched_tokens.
    #[arg(long, env = "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", global = true)]
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// Router mode for models that do not set one.
    #[arg(long, env = "DYN_ROUTER_MODE", global = true, value_parser = parse_router_mode)]
    pub router_mode: Option<RouterMode>,
    /// Engine slots per worker (N) for workers that do not set `engine_request_limit`.
    #[arg(long, env = "DYN_ENGINE_REQUEST_LIMIT", global = true)]
    pub engine_request_limit: Option<u32>,
    /// Waiting places per worker (Q, at least 2) for workers that do not set one.
    #[arg(
        long,
        env = "DYN_DYNAMO_REQUEST_QUEUE_LIMIT",
        global = true,
        hide = true
    )]
    pub request_queue_limit: Option<u32>,
    /// How many times a refused request may move to another worker.
    #[arg(long, env = "DYN_MIGRATION_LIMIT", global = true)]
    pub migration_limit: Option<u32>,
    /// Count generated tokens into router-tracked decode blocks.
    #[arg(long, env = "DYN_ROUTER_TRACK_OUTPUT_BLOCKS", global = true, num_args = 0..=1, default_missing_value = "true")]
    pub router_track_output_blocks: Option<bool>,
}

fn parse_router_mode(s: &str) -> Result<RouterMode, String> {
    RouterMode::parse(s).ok_or_else(|| {
        format!(
            "unknown router mode `{s}` (expected one of: {})",
            RouterMode::NAMES
        )
    })
}

impl Knobs {
    /// The overrides these knobs (and `DYN_HTTP_OVERLOAD_STATUS_CODE`) make.
    pub fn overrides(&self, env: impl Fn(&str) -> Option<String>) -> Overrides {
        Overrides {
            thresholds: Thresholds {
                active_decode_blocks_threshold: self.active_decode_blocks_threshold,
                active_prefill_tokens_threshold: self.active_prefill_tokens_threshold,
                active_prefill_tokens_threshold_frac: self.active_prefill_tokens_threshold_frac,
            },
            router_mode: self.router_mode,
            track_output_blocks: self.router_track_output_blocks,
            overload_status_env: env("DYN_HTTP_OVERLOAD_STATUS_CODE"),
            engine_request_limit: self.engine_request_limit,
            request_queue_limit: self.request_queue_limit,
            migration_limit: self.migration_limit,
            admin_token_env: env("SPILLWAY_ADMIN_TOKEN"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_knobs_and_subcommand() {
        let cli = Cli::try_parse_from([
            "spillway",
            "--config",
            "x.toml",
            "--active-decode-blocks-threshold",
            "0.85",
            "--router-mode",
            "least-loaded",
            "--router-track-output-blocks",
        ])
        .unwrap();
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("x.toml")));
        assert_eq!(cli.knobs.active_decode_blocks_threshold, Some(0.85));
        assert_eq!(cli.knobs.router_mode, Some(RouterMode::LeastLoaded));
        assert_eq!(cli.knobs.router_track_output_blocks, Some(true));
        let cli = Cli::try_parse_from(["spillway", "check-config", "f.toml"]).unwrap();
        assert!(matches!(cli.command, Some(Command::CheckConfig { .. })));
        assert!(Cli::try_parse_from(["spillway", "--router-mode", "kv"]).is_err());
    }

    #[test]
    fn mock_engine_flags() {
        let cli = Cli::try_parse_from(["spillway", "mock-engine"]).unwrap();
        let Some(Command::MockEngine(args)) = cli.command else {
            panic!("mock-engine subcommand");
        };
        assert_eq!(args.config(), MockConfig::default());
        let cli = Cli::try_parse_from([
            "spillway",
            "mock-engine",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "Qwen/Qwen3-0.6B",
            "--kv-blocks",
            "100",
            "--decode-step-ms",
            "20",
            "--decode-step-per-seq-ms",
            "0.5",
            "--push-load",
            "http://127.0.0.1:9090",
            "--worker-name",
            "w1",
        ])
        .unwrap();
        let Some(Command::MockEngine(args)) = cli.command else {
            panic!("mock-engine subcommand");
        };
        let c = args.config();
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.model, "Qwen/Qwen3-0.6B");
        assert_eq!(c.kv_blocks, 100);
        assert_eq!(c.decode_step_base_ms, 20.0);
        assert_eq!(c.decode_step_per_seq_ms, 0.5);
        assert_eq!(c.push_load.as_deref(), Some("http://127.0.0.1:9090"));
        assert_eq!(c.worker_name.as_deref(), Some("w1"));
    }

    #[test]
    fn overload_env_is_read_through_the_lookup() {
        let o = Knobs::default()
            .overrides(|k| (k == "DYN_HTTP_OVERLOAD_STATUS_CODE").then(|| "429".to_string()));
        assert_eq!(o.overload_status_env.as_deref(), Some("429"));
    }
}
