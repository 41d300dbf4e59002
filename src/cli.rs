//! Command line: `spillway [--config FILE]`, `spillway check-config FILE`, and the
//! Dynamo-named knobs (semantics §9), each also readable from its environment variable.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{Config, ConfigError, DEFAULT_CONFIG, Overrides, RouterMode};
use crate::shed::Thresholds;

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
    #[arg(long, short = 'c', global = true)]
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
}

/// Dynamo-compatible knobs: defaults for every model, below per-model keys in the file.
#[derive(Debug, Clone, Default, clap::Args)]
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
        }
    }
}

/// Loads `path`, or the embedded default when there is none.
pub fn load_config(
    path: Option<&std::path::Path>,
    overrides: &Overrides,
) -> Result<Config, ConfigError> {
    match path {
        Some(p) => Config::load(p, overrides),
        None => Config::parse(DEFAULT_CONFIG, overrides),
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
    fn overload_env_is_read_through_the_lookup() {
        let o = Knobs::default()
            .overrides(|k| (k == "DYN_HTTP_OVERLOAD_STATUS_CODE").then(|| "429".to_string()));
        assert_eq!(o.overload_status_env.as_deref(), Some("429"));
    }
}
