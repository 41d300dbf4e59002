//! Configuration: the TOML file ([`file`]) validated into an immutable [`Config`]. Every
//! error names the key and, where the file has one, its line. Dynamo-named flags and
//! environment variables ([`Overrides`]) fill in what the file leaves unset. Validation is
//! pure: host names stay names ([`addr::HostPort`]) until the runtime resolves them.

pub mod access_log;
pub mod addr;
mod classes;
mod disagg;
mod discovery;
pub mod file;
mod health;
mod kv;
mod tls;
mod validate;
mod workers;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::http::Limits;
use crate::route::{KvSettings, RouterMode};
use crate::shed::{Adaptive, Class, Thresholds};
pub use addr::{Addrs, HostPort, WorkerAddrs, parse_http_url, parse_worker_url};
pub use classes::{ClassSettings, Classes, DEFAULT_CLASS_HEADER};
pub use disagg::{DEFAULT_BOOTSTRAP_PORT, Disagg, Handoff, PoolRole};
pub use discovery::{
    Capacity, DEFAULT_DNS_INTERVAL_MS, Discovery, DiscoverySource, Found, NatsConfig,
};
use file::FileConfig;
pub use health::RetryBudget;
pub use kv::{KV_EVENTS, KvOverrides, MAX_KV_BLOCK_SIZE, check_overrides as check_kv_overrides};
pub use tls::{DEFAULT_HANDSHAKE_TIMEOUT_MS, TlsConfig, TlsListener};

/// The documented example (tuning/spillway.toml), kept valid by the tests.
pub const EXAMPLE_CONFIG: &str = include_str!("../../tuning/spillway.toml");

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;
pub const DEFAULT_RETRY_AFTER_SECS: u32 = 1;
pub const DEFAULT_LOAD_STALENESS_MS: u64 = 5_000;
pub const DEFAULT_SCRAPE_INTERVAL_MS: u64 = 500;
pub const DEFAULT_MONITOR_INTERVAL_MS: u64 = 20;
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
pub const DEFAULT_REQUEST_QUEUE_LIMIT: u32 = 16;
pub const DEFAULT_REQUEST_QUEUE_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_MIGRATION_LIMIT: u32 = 3;
pub const DEFAULT_DRAIN_GRACE_MS: u64 = 2_000;
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{key}{}: {msg}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Invalid {
        key: String,
        line: Option<usize>,
        msg: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsFormat {
    Vllm,
    Sglang,
    Llamacpp,
}

/// Where a worker's load comes from (docs/behaviour.md §2.3). Push is always accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LoadSources {
    pub push: bool,
    pub scrape: bool,
    pub tracked: bool,
}

/// Values from the Dynamo-named CLI flags and environment variables (docs/behaviour.md §20.2).
/// Per-model and per-worker keys in the file win over these.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub thresholds: Thresholds,
    /// Dynamo's canary checks: `DYN_HEALTH_CHECK_ENABLED`, `DYN_CANARY_WAIT_TIME`,
    /// `DYN_HEALTH_CHECK_REQUEST_TIMEOUT` (seconds), for a file without `[health_check]`.
    pub canary: CanaryOverrides,
    pub router_mode: Option<RouterMode>,
    /// `kv` routing's knobs (`--router-temperature`, ...).
    pub kv: KvOverrides,
    pub track_output_blocks: Option<bool>,
    /// Raw `DYN_HTTP_OVERLOAD_STATUS_CODE`, read once at start; overrides the file.
    pub overload_status_env: Option<String>,
    pub engine_request_limit: Option<u32>,
    pub request_queue_limit: Option<u32>,
    pub migration_limit: Option<u32>,
    /// `SPILLWAY_ADMIN_TOKEN`; overrides `admin_token` in the file.
    pub admin_token_env: Option<String>,
    /// `--tls-cert-path` / `DYN_TLS_CERT_PATH`: `tls.cert` when the file sets none.
    pub tls_cert_path: Option<String>,
    /// `--tls-key-path` / `DYN_TLS_KEY_PATH`: `tls.key` when the file sets none.
    pub tls_key_path: Option<String>,
}

/// Dynamo's canary health check settings, from its environment variables.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CanaryOverrides {
    pub enabled: Option<bool>,
    pub wait_secs: Option<u64>,
    pub timeout_secs: Option<u64>,
}

/// Where the configuration comes from, kept for reloads.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// The file (`None`: built in, as the demo's; nothing to reload).
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
}

/// Dynamo's parse of `DYN_HTTP_OVERLOAD_STATUS_CODE`: trimmed u16 in 200..=999, else 529.
pub fn parse_overload_status_env(value: &str) -> u16 {
    match value.trim().parse::<u16>() {
        Ok(code) if (200..=999).contains(&code) => code,
        _ => DEFAULT_OVERLOAD_STATUS,
    }
}

/// The validated configuration. Immutable; a reload builds a new one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub listen: HostPort,
    pub admin_listen: HostPort,
    pub cores: usize,
    pub cpus: Vec<usize>,
    pub monitor_cpu: Option<usize>,
    pub pin_cores: bool,
    pub overload_status_code: u16,
    pub retry_after_secs: u32,
    /// A request header of whole milliseconds in which a client states its time budget
    /// (lowercase), beside `x-stainless-timeout`: waits for a slot end by it.
    pub client_budget_header: Option<String>,
    /// A request header naming its tenant (lowercase): waiting rooms serve tenants in
    /// turn (docs/behaviour.md §8.13). `authorization` keys tenants by bearer token.
    pub tenant_header: Option<String>,
    /// The share of a model's waiting room one tenant may hold (1.0: no cap).
    pub tenant_room_share: f64,
    /// Busy workers still take requests of a tenant below the mean in flight at the
    /// model (docs/behaviour.md §8.13): true by default with `tenant_header`.
    pub busy_spares_light_tenants: bool,
    pub load_staleness_ms: u64,
    pub scrape_interval_ms: u64,
    pub monitor_interval_ms: u64,
    /// Times a refused request may move to another worker (0 = never).
    pub migration_limit: u32,
    /// How many failed attempts may be retried at once.
    pub retry_budget: RetryBudget,
    /// `[outlier]`: passive outlier detection.
    pub outlier: crate::health::OutlierSettings,
    /// After SIGTERM: health answers 503 at once, listeners close after the grace, and
    /// requests in flight get up to the timeout to finish.
    pub drain_grace_ms: u64,
    pub drain_timeout_ms: u64,
    /// Bearer token the admin listener's mutating endpoints require (none = open).
    #[serde(skip_serializing)]
    pub admin_token: Option<String>,
    pub limits: Limits,
    pub classes: Classes,
    /// `[access_log]`: one line per request, and W3C trace context.
    pub access_log: access_log::AccessLogConfig,
    /// Load events over NATS (`[nats]`).
    pub nats: Option<NatsConfig>,
    /// `[tls]`: the TLS listener, the workers' CA.
    pub tls: TlsConfig,
    pub models: Vec<ModelConfig>,
    /// Every distinct worker, by name; models refer to them by index.
    pub workers: Vec<WorkerConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub router_mode: RouterMode,
    /// `kv` routing's settings (used in that mode; Dynamo's defaults otherwise).
    pub kv: KvSettings,
    pub thresholds: Thresholds,
    pub track_output_blocks: bool,
    /// The class of this model's requests that name none (`classes.default` if unset).
    pub class: Option<Class>,
    /// The adaptive mode: thresholds scaled per worker to hold a TTFT target.
    pub adaptive: Option<Adaptive>,
    /// Indices into [`Config::workers`]: the listed workers, then any found.
    pub workers: Vec<usize>,
    /// Where more workers are found at run time (`[models.dns]`, `[models.etcd]`).
    pub discovery: Option<Discovery>,
    /// Active checks of its workers: its `[models.health_check]`, else `[health_check]`.
    pub health_check: Option<crate::health::CheckSettings>,
    /// Its waiting room (docs/behaviour.md §8.12), when `waiting_room_size` is set.
    pub waiting_room: Option<WaitingRoom>,
    /// A prefill pool, or a model clients name (docs/behaviour.md §23).
    pub role: PoolRole,
    /// Its prefill pool and handoff, when its requests are disaggregated.
    pub disagg: Option<Disagg>,
}

/// A model's waiting room: `size` places over all cores, each wait at most `timeout_ms`;
/// a request that finds no worker available waits up to `hold_ms` when set (a rollout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WaitingRoom {
    pub size: u32,
    pub timeout_ms: u64,
    pub hold_ms: Option<u64>,
    /// A request that finds every eligible worker busy or held waits in the room for
    /// one to become admissible (else it gets the overload answer at once).
    pub waits_for_busy: bool,
}

impl WaitingRoom {
    pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;
    /// Places a room may have (the width of its counts).
    pub const MAX_SIZE: u32 = (1 << 20) - 1;
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerConfig {
    pub name: String,
    /// `http://host:port` or `https://host:port`, as normalised from the file.
    pub url: String,
    /// An `https://` worker: TLS with SNI `endpoint.host`, trusting `tls.upstream_ca` or
    /// the system's roots.
    pub tls: bool,
    pub endpoint: HostPort,
    pub load_sources: LoadSources,
    pub metrics_format: MetricsFormat,
    /// Where its Prometheus metrics are scraped (`metrics_url`, else the worker itself).
    pub metrics: HostPort,
    pub metrics_path: String,
    pub kv_total_blocks: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    /// The engine's slots (requests it runs at once, all ranks together), when known
    /// from the file; llama.cpp's `/props` and pushed reports say it at run time.
    pub total_slots: Option<u64>,
    pub dp_size: u32,
    pub block_size: u32,
    /// Engine slots (N); `None` = no admission cap.
    pub engine_request_limit: Option<u32>,
    /// Waiting places (Q) when N is set.
    pub request_queue_limit: u32,
    pub request_queue_timeout_ms: u64,
    /// Its SGLang bootstrap port, as a prefill worker (docs/behaviour.md §23.6).
    pub bootstrap_port: u16,
}

impl Config {
    /// Reads and validates a file.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, overrides)
    }

    pub fn parse(text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
        let file: FileConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(one_line(&e)))?;
        validate::Validator::new(text).config(file, overrides)
    }

    /// The effective configuration as TOML (`spillway check-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }
}

/// toml's error as one line (for logs): position, the offending line, the message.
fn one_line(e: &toml::de::Error) -> String {
    let text = e.to_string();
    let mut lines = text.lines();
    let head = lines.next().unwrap_or("TOML parse error").trim();
    let mut snippet = None;
    let mut message = Vec::new();
    for line in lines {
        let t = line.trim();
        match t.split_once(" | ") {
            Some((n, code)) if n.chars().all(|c| c.is_ascii_digit()) => snippet = Some(code.trim()),
            _ if t.is_empty() || t.starts_with('|') => {}
            _ => message.push(t),
        }
    }
    match snippet {
        Some(code) => format!("{head} (`{code}`): {}", message.join(" ")),
        None => format!("{head}: {}", message.join(" ")),
    }
}

/// Default data-path cores: available CPUs minus one for the monitor, at least one.
pub fn default_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .saturating_sub(1)
        .max(1)
}

#[cfg(test)]
mod tests;
