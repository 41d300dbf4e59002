//! The command line (part of the binary): `spillway [--config FILE]`, `spillway check-config FILE`,
//! `spillway mock-engine [FLAGS]`, and the Dynamo-named knobs (docs/behaviour.md §20.2), each also
//! readable from its environment variable.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use spillway::Overrides;
use spillway::config::{CanaryOverrides, KV_EVENTS, KvOverrides, check_kv_overrides};
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
    /// vLLM's automatic prefix caching: an LRU of up to --kv-blocks prompt block hashes;
    /// cached prompt tokens skip prefill.
    #[arg(long)]
    pub enable_prefix_caching: bool,
    /// Spillway admin base URL to push load events to (POST {URL}/load).
    #[arg(long, value_name = "URL")]
    pub push_load: Option<String>,
    /// worker_id in pushed events (default: the listen host:port).
    #[arg(long)]
    pub worker_name: Option<String>,
    /// How often load is pushed, in milliseconds.
    #[arg(long, default_value_t = defaults::PUSH_INTERVAL_MS)]
    pub push_interval_ms: u64,
    /// Fault mode at start: none, fail (/v1/* answer 500 at once), hang (nothing is
    /// answered), dead-core (/health answers, /v1/* never), flap (healthy and fail in
    /// turn); `POST /fault {"mode":"..."}` on the engine's port switches it.
    #[arg(long, value_name = "MODE", default_value_t = spillway_mock::Fault::None)]
    pub fault: spillway_mock::Fault,
    /// Each half of a flap cycle (healthy, then failing), in milliseconds.
    #[arg(long, default_value_t = defaults::FLAP_PERIOD_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub flap_period_ms: u64,
    /// Bytes of a `system_fingerprint` string in every response object and stream event
    /// (0: none), to make events as large as an engine's with logprobs.
    #[arg(long, default_value_t = 0)]
    pub fingerprint_bytes: usize,
    /// Prefill/decode disaggregation role: prefill (vLLM stage 1 answers carry
    /// kv_transfer_params; SGLang requests stop at the first token), decode (valid
    /// kv_transfer_params or SGLang bootstrap fields skip the prefill), both (a whole
    /// engine; SGLang bootstrap fields are ignored).
    #[arg(long, value_name = "ROLE", default_value_t = spillway_mock::Role::Both)]
    pub role: spillway_mock::Role,
    /// Simulated KV transfer time per block of a prompt a decode engine receives, in
    /// milliseconds.
    #[arg(long, default_value_t = defaults::KV_TRANSFER_MS_PER_BLOCK)]
    pub kv_transfer_ms_per_block: f64,
    /// SGLang bootstrap port of this engine as a prefill worker (requests to a prefill
    /// engine must name it).
    #[arg(long, default_value_t = defaults::BOOTSTRAP_PORT)]
    pub bootstrap_port: u16,
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
            enable_prefix_caching: self.enable_prefix_caching,
            push_load: self.push_load.clone(),
            worker_name: self.worker_name.clone(),
            push_interval_ms: self.push_interval_ms,
            fault: self.fault,
            flap_period_ms: self.flap_period_ms,
            fingerprint_bytes: self.fingerprint_bytes,
            role: self.role,
            kv_transfer_ms_per_block: self.kv_transfer_ms_per_block,
            bootstrap_port: self.bootstrap_port,
        }
    }
}

/// Help heading of the proxy's options, which clap also lists under every subcommand.
const PROXY_OPTIONS: &str = "Proxy options";

/// Dynamo-compatible knobs: defaults for every model, below per-model keys in the file.
/// Each also reads its environment variable (a flag wins over it); as in Dynamo, an
/// environment value that is empty or `None` means unset.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = PROXY_OPTIONS)]
pub struct Knobs {
    /// Busy when used KV blocks exceed this fraction of the total (0.0..=1.0)
    /// [env: DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD].
    #[arg(long, global = true)]
    pub active_decode_blocks_threshold: Option<f64>,
    /// Busy when active prefill tokens exceed this count
    /// [env: DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD].
    #[arg(long, global = true)]
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Busy when active prefill tokens exceed this fraction of max_num_batched_tokens
    /// [env: DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC].
    #[arg(long, global = true)]
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// Busy when the engine has more requests waiting in its own queue than this
    /// [env: SPILLWAY_WAITING_REQUESTS_THRESHOLD].
    #[arg(long, global = true)]
    pub waiting_requests_threshold: Option<u64>,
    /// Router mode for models that do not set one [env: DYN_ROUTER_MODE].
    #[arg(long, global = true, value_parser = parse_router_mode)]
    pub router_mode: Option<RouterMode>,
    /// Engine slots per worker (N) for workers that do not set `engine_request_limit`
    /// [env: DYN_ENGINE_REQUEST_LIMIT].
    #[arg(long, global = true)]
    pub engine_request_limit: Option<u32>,
    /// How many times a refused request may move to another worker [env: DYN_MIGRATION_LIMIT].
    #[arg(long, global = true)]
    pub migration_limit: Option<u32>,
    /// Count generated tokens into router-tracked decode blocks
    /// [env: DYN_ROUTER_TRACK_OUTPUT_BLOCKS].
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "true")]
    pub router_track_output_blocks: Option<bool>,
    /// `kv` routing: 0 picks the cheapest worker, above 0 samples by softmax
    /// [env: DYN_ROUTER_TEMPERATURE].
    #[arg(long, global = true)]
    pub router_temperature: Option<f64>,
    /// `kv` routing: weight of prefill work in the cost [env: DYN_ROUTER_PREFILL_LOAD_SCALE].
    #[arg(long, global = true)]
    pub router_prefill_load_scale: Option<f64>,
    /// Deprecated name of --router-prefill-load-scale
    /// [env: DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT].
    #[arg(long, global = true)]
    pub router_kv_overlap_score_weight: Option<f64>,
    /// `kv` routing: tokens per KV block, the prompt's hashing chunk
    /// [env: DYN_KV_CACHE_BLOCK_SIZE].
    #[arg(long, global = true)]
    pub kv_cache_block_size: Option<u32>,
    /// `kv` routing: seconds a routed prefix is predicted to stay cached
    /// [env: DYN_ROUTER_TTL_SECS].
    #[arg(long, global = true)]
    pub router_ttl_secs: Option<f64>,
    /// `kv` routing predicts caches from its own decisions (accepted for Dynamo
    /// compatibility; KV events are never used) [env: DYN_ROUTER_USE_KV_EVENTS=false].
    #[arg(long, global = true)]
    pub no_router_kv_events: bool,
    /// TLS on the data listener: certificate chain (PEM), when the file's `[tls]` sets no
    /// `cert` [env: DYN_TLS_CERT_PATH].
    #[arg(long, global = true)]
    pub tls_cert_path: Option<String>,
    /// TLS on the data listener: private key (PEM), when the file's `[tls]` sets no `key`
    /// [env: DYN_TLS_KEY_PATH].
    #[arg(long, global = true)]
    pub tls_key_path: Option<String>,
}

fn parse_router_mode(s: &str) -> Result<RouterMode, String> {
    RouterMode::parse(s).ok_or_else(|| {
        format!(
            "unknown router mode `{s}` (expected one of: {})",
            RouterMode::NAMES
        )
    })
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("`{s}` is not true or false")),
    }
}

/// A knob from the flag, else from the environment variable `var`: empty or `None` there
/// means unset (Dynamo's convention); anything else must parse.
fn knob<T>(
    flag: Option<T>,
    var: &str,
    env: &impl Fn(&str) -> Option<String>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    if flag.is_some() {
        return Ok(flag);
    }
    match env(var).as_deref().map(str::trim) {
        None | Some("" | "None") => Ok(None),
        Some(v) => parse(v).map(Some).map_err(|e| format!("{var}={v}: {e}")),
    }
}

fn number<T: std::str::FromStr>(v: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    v.parse().map_err(|e: T::Err| e.to_string())
}

fn text(v: &str) -> Result<String, String> {
    Ok(v.to_string())
}

impl Knobs {
    /// The overrides these knobs and their environment variables make, with
    /// `DYN_HTTP_OVERLOAD_STATUS_CODE`, `DYN_DYNAMO_REQUEST_QUEUE_LIMIT` and
    /// `SPILLWAY_ADMIN_TOKEN`. An unparsable environment value is an error naming it.
    pub fn overrides(&self, env: impl Fn(&str) -> Option<String>) -> Result<Overrides, String> {
        let env = &env;
        Ok(Overrides {
            thresholds: Thresholds {
                active_decode_blocks_threshold: knob(
                    self.active_decode_blocks_threshold,
                    "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD",
                    env,
                    number,
                )?,
                active_prefill_tokens_threshold: knob(
                    self.active_prefill_tokens_threshold,
                    "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD",
                    env,
                    number,
                )?,
                active_prefill_tokens_threshold_frac: knob(
                    self.active_prefill_tokens_threshold_frac,
                    "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC",
                    env,
                    number,
                )?,
                waiting_requests_threshold: knob(
                    self.waiting_requests_threshold,
                    "SPILLWAY_WAITING_REQUESTS_THRESHOLD",
                    env,
                    number,
                )?,
            },
            router_mode: knob(self.router_mode, "DYN_ROUTER_MODE", env, parse_router_mode)?,
            track_output_blocks: knob(
                self.router_track_output_blocks,
                "DYN_ROUTER_TRACK_OUTPUT_BLOCKS",
                env,
                parse_bool,
            )?,
            kv: self.kv_overrides(env)?,
            canary: CanaryOverrides {
                enabled: knob(None, "DYN_HEALTH_CHECK_ENABLED", env, parse_bool)?,
                wait_secs: knob(None, "DYN_CANARY_WAIT_TIME", env, number)?,
                timeout_secs: knob(None, "DYN_HEALTH_CHECK_REQUEST_TIMEOUT", env, number)?,
            },
            overload_status_env: env("DYN_HTTP_OVERLOAD_STATUS_CODE"),
            engine_request_limit: knob(
                self.engine_request_limit,
                "DYN_ENGINE_REQUEST_LIMIT",
                env,
                number,
            )?,
            request_queue_limit: knob(None, "DYN_DYNAMO_REQUEST_QUEUE_LIMIT", env, number)?,
            migration_limit: knob(self.migration_limit, "DYN_MIGRATION_LIMIT", env, number)?,
            admin_token_env: env("SPILLWAY_ADMIN_TOKEN"),
            tls_cert_path: knob(self.tls_cert_path.clone(), "DYN_TLS_CERT_PATH", env, text)?,
            tls_key_path: knob(self.tls_key_path.clone(), "DYN_TLS_KEY_PATH", env, text)?,
        })
    }

    /// `kv` routing's knobs. The overlap weight is the prefill scale's deprecated name: one
    /// of the two. KV events can only be off.
    fn kv_overrides(&self, env: &impl Fn(&str) -> Option<String>) -> Result<KvOverrides, String> {
        let scale = knob(
            self.router_prefill_load_scale,
            "DYN_ROUTER_PREFILL_LOAD_SCALE",
            env,
            number,
        )?;
        let weight = knob(
            self.router_kv_overlap_score_weight,
            "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT",
            env,
            number,
        )?;
        let events = knob(None, "DYN_ROUTER_USE_KV_EVENTS", env, parse_bool)?;
        if events == Some(true) && !self.no_router_kv_events {
            return Err(format!("DYN_ROUTER_USE_KV_EVENTS=true: {KV_EVENTS}"));
        }
        let o = KvOverrides {
            router_temperature: knob(
                self.router_temperature,
                "DYN_ROUTER_TEMPERATURE",
                env,
                number,
            )?,
            router_prefill_load_scale: scale.or(weight),
            kv_cache_block_size: knob(
                self.kv_cache_block_size,
                "DYN_KV_CACHE_BLOCK_SIZE",
                env,
                number,
            )?,
            router_ttl_secs: knob(self.router_ttl_secs, "DYN_ROUTER_TTL_SECS", env, number)?,
        };
        check_kv_overrides(&o)?;
        Ok(o)
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
        assert!(Cli::try_parse_from(["spillway", "--router-mode", "kv"]).is_ok());
        assert!(Cli::try_parse_from(["spillway", "--router-mode", "kv-ish"]).is_err());
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
            "--enable-prefix-caching",
            "--fault",
            "flap",
            "--flap-period-ms",
            "500",
            "--role",
            "decode",
            "--kv-transfer-ms-per-block",
            "0.5",
            "--bootstrap-port",
            "9001",
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
        assert!(c.enable_prefix_caching);
        assert_eq!(c.fault, spillway_mock::Fault::Flap);
        assert_eq!(c.flap_period_ms, 500);
        assert_eq!(c.role, spillway_mock::Role::Decode);
        assert_eq!(c.kv_transfer_ms_per_block, 0.5);
        assert_eq!(c.bootstrap_port, 9001);
        for bad in [
            ["--fault", "sick"],
            ["--flap-period-ms", "0"],
            ["--role", "mixed"],
            ["--bootstrap-port", "70000"],
        ] {
            assert!(Cli::try_parse_from(["spillway", "mock-engine", bad[0], bad[1]]).is_err());
        }
    }

    #[test]
    fn overload_env_is_read_through_the_lookup() {
        let o = Knobs::default()
            .overrides(|k| (k == "DYN_HTTP_OVERLOAD_STATUS_CODE").then(|| "429".to_string()))
            .unwrap();
        assert_eq!(o.overload_status_env.as_deref(), Some("429"));
    }

    fn with_env(pairs: &[(&str, &str)]) -> Result<Overrides, String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Knobs::default()
            .overrides(move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn dyn_env_none_and_empty_mean_unset() {
        let vars = [
            "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD",
            "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD",
            "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC",
            "DYN_ROUTER_MODE",
            "DYN_ROUTER_TRACK_OUTPUT_BLOCKS",
            "DYN_ENGINE_REQUEST_LIMIT",
            "DYN_DYNAMO_REQUEST_QUEUE_LIMIT",
            "DYN_MIGRATION_LIMIT",
            "DYN_HEALTH_CHECK_ENABLED",
            "DYN_CANARY_WAIT_TIME",
            "DYN_HEALTH_CHECK_REQUEST_TIMEOUT",
        ];
        for unset in ["None", "", "  "] {
            let env: Vec<(&str, &str)> = vars.iter().map(|v| (*v, unset)).collect();
            assert_eq!(with_env(&env), Ok(Overrides::default()), "{unset:?}");
        }
        let o = with_env(&[
            ("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "0.5"),
            ("DYN_ROUTER_MODE", "random"),
            ("DYN_ROUTER_TRACK_OUTPUT_BLOCKS", "true"),
            ("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "4"),
        ])
        .unwrap();
        assert_eq!(o.thresholds.active_decode_blocks_threshold, Some(0.5));
        assert_eq!(o.router_mode, Some(RouterMode::Random));
        assert_eq!(o.track_output_blocks, Some(true));
        assert_eq!(o.request_queue_limit, Some(4));
        let err = with_env(&[("DYN_ENGINE_REQUEST_LIMIT", "lots")]).unwrap_err();
        assert!(err.starts_with("DYN_ENGINE_REQUEST_LIMIT=lots: "), "{err}");
    }

    #[test]
    fn dynamo_kv_flags_and_env() {
        let cli = Cli::try_parse_from([
            "spillway",
            "--router-mode",
            "kv",
            "--router-temperature",
            "0.5",
            "--kv-cache-block-size",
            "32",
            "--no-router-kv-events",
        ])
        .unwrap();
        let o = cli.knobs.overrides(|_| None).unwrap();
        assert_eq!(o.router_mode, Some(RouterMode::Kv));
        assert_eq!(o.kv.router_temperature, Some(0.5));
        assert_eq!(o.kv.kv_cache_block_size, Some(32));
        let o = with_env(&[
            ("DYN_ROUTER_MODE", "kv"),
            ("DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "2"),
            ("DYN_ROUTER_TTL_SECS", "30"),
            ("DYN_ROUTER_USE_KV_EVENTS", "false"),
            ("DYN_ROUTER_TEMPERATURE", "None"),
        ])
        .unwrap();
        assert_eq!(o.kv.router_prefill_load_scale, Some(2.0));
        assert_eq!(o.kv.router_ttl_secs, Some(30.0));
        assert_eq!(o.kv.router_temperature, None);
        let bad = [
            ("DYN_ROUTER_USE_KV_EVENTS", "true", "KV events"),
            ("DYN_ROUTER_TEMPERATURE", "-1", "at least 0"),
            ("DYN_KV_CACHE_BLOCK_SIZE", "0", "between 1 and 256"),
            ("DYN_ROUTER_TTL_SECS", "0", "greater than 0"),
            (
                "DYN_ROUTER_PREFILL_LOAD_SCALE",
                "much",
                "DYN_ROUTER_PREFILL_LOAD_SCALE=much",
            ),
        ];
        for (var, value, says) in bad {
            let err = with_env(&[(var, value)]).unwrap_err();
            assert!(err.contains(says), "{var}={value}: {err}");
        }
    }

    #[test]
    fn a_flag_wins_over_its_env_var() {
        let cli = Cli::try_parse_from(["spillway", "--migration-limit", "2"]).unwrap();
        let o = cli
            .knobs
            .overrides(|k| (k == "DYN_MIGRATION_LIMIT").then(|| "5".to_string()))
            .unwrap();
        assert_eq!(o.migration_limit, Some(2));
    }
}
