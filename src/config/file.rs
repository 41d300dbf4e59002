//! The TOML file as written by operators: serde structs, every table `deny_unknown_fields`.
//! Values that need checks beyond their type carry their position (`Spanned`) so errors
//! can name the line.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<Spanned<String>>,
    pub admin_listen: Option<Spanned<String>>,
    pub cores: Option<usize>,
    pub cpus: Option<Vec<usize>>,
    pub monitor_cpu: Option<usize>,
    pub pin_cores: Option<bool>,
    #[serde(default)]
    pub limits: FileLimits,
    pub overload_status_code: Option<Spanned<u16>>,
    pub retry_after_secs: Option<u32>,
    pub client_budget_header: Option<Spanned<String>>,
    /// The header naming a request's tenant (hashed, never logged), and each tenant's
    /// share of a model's waiting room.
    pub tenant_header: Option<Spanned<String>>,
    pub tenant_room_share: Option<Spanned<f64>>,
    pub busy_spares_light_tenants: Option<Spanned<bool>>,
    pub load_staleness_ms: Option<Spanned<u64>>,
    pub scrape_interval_ms: Option<Spanned<u64>>,
    pub monitor_interval_ms: Option<Spanned<u64>>,
    pub migration_limit: Option<u32>,
    pub retry_budget_percent: Option<Spanned<u32>>,
    pub retry_budget_min: Option<u32>,
    pub outlier: Option<FileOutlier>,
    pub health_check: Option<FileHealthCheck>,
    pub drain_grace_ms: Option<u64>,
    pub drain_timeout_ms: Option<u64>,
    pub admin_token: Option<Spanned<String>>,
    #[serde(default)]
    pub classes: FileClasses,
    pub nats: Option<FileNats>,
    pub tls: Option<FileTls>,
    pub access_log: Option<FileAccessLog>,
    #[serde(default)]
    pub models: Vec<FileModel>,
}

/// `[outlier]`: passive outlier detection.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOutlier {
    pub enabled: Option<bool>,
    pub consecutive_failures: Option<Spanned<u32>>,
    pub base_ejection_ms: Option<Spanned<u64>>,
    pub max_ejection_ms: Option<Spanned<u64>>,
    pub min_healthy_percent: Option<Spanned<u32>>,
    pub interval_ms: Option<Spanned<u64>>,
    pub failure_share_above_peers: Option<Spanned<f64>>,
    pub request_volume: Option<u64>,
}

/// `[health_check]`, or a model's `[models.health_check]`: active checks.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHealthCheck {
    pub kind: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub interval_ms: Option<Spanned<u64>>,
    pub timeout_ms: Option<Spanned<u64>>,
    pub rise: Option<Spanned<u32>>,
    pub fall: Option<Spanned<u32>>,
}

/// `[tls]`: the TLS listener's certificate, client certificates, the workers' CA.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTls {
    pub listen: Option<Spanned<String>>,
    pub cert: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
    pub client_ca: Option<Spanned<String>>,
    pub handshake_timeout_ms: Option<Spanned<u64>>,
    pub upstream_ca: Option<Spanned<String>>,
}

/// `[nats]`: load events over NATS, received and/or published.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileNats {
    pub url: Spanned<String>,
    pub subscribe: Option<Spanned<String>>,
    pub publish: Option<Spanned<String>>,
    pub publish_interval_ms: Option<Spanned<u64>>,
    pub publish_as: Option<Spanned<String>>,
    pub replica_sync: Option<Spanned<String>>,
}

/// `[models.dns]`: the model's workers are the addresses a name resolves to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDns {
    pub name: Spanned<String>,
    pub port: Option<Spanned<u16>>,
    pub srv: Option<Spanned<bool>>,
    pub server: Option<Spanned<String>>,
    pub interval_ms: Option<Spanned<u64>>,
    pub nxdomain_hold_ms: Option<Spanned<u64>>,
}

/// `[models.etcd]`: the model's workers are the keys under a prefix.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEtcd {
    pub endpoints: Spanned<Vec<String>>,
    pub prefix: Spanned<String>,
}

/// `[classes]`: where a request's class comes from, and what each class may use.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClasses {
    pub header: Option<Spanned<String>>,
    pub default: Option<Spanned<String>>,
    pub critical: Option<FileClass>,
    pub standard: Option<FileClass>,
    pub sheddable: Option<FileClass>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClass {
    pub busy_threshold_scale: Option<Spanned<f64>>,
    pub slot_share: Option<Spanned<f64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    pub max_header_bytes: Option<Spanned<usize>>,
    pub max_body_bytes: Option<Spanned<usize>>,
    pub header_read_timeout_ms: Option<Spanned<u64>>,
    pub body_read_timeout_ms: Option<Spanned<u64>>,
    pub idle_timeout_ms: Option<Spanned<u64>>,
    pub buffer_release_ms: Option<Spanned<u64>>,
    pub connect_timeout_ms: Option<Spanned<u64>>,
    pub upstream_first_byte_timeout_ms: Option<Spanned<u64>>,
    pub upstream_stream_idle_timeout_ms: Option<Spanned<u64>>,
    pub client_send_timeout_ms: Option<Spanned<u64>>,
    pub max_connections: Option<Spanned<usize>>,
    pub pool_idle_timeout_ms: Option<u64>,
    pub pool_max_idle_per_worker: Option<usize>,
    pub worker_down_backoff_ms: Option<Spanned<u64>>,
    pub worker_down_backoff_max_ms: Option<Spanned<u64>>,
    pub worker_refusal_hold_ms: Option<Spanned<u64>>,
    pub admin_read_timeout_ms: Option<Spanned<u64>>,
    pub admin_max_connections: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileModel {
    pub name: Spanned<String>,
    pub router_mode: Option<Spanned<String>>,
    pub router_temperature: Option<Spanned<f64>>,
    pub router_prefill_load_scale: Option<Spanned<f64>>,
    /// Dynamo's deprecated name of `router_prefill_load_scale`.
    pub router_kv_overlap_score_weight: Option<Spanned<f64>>,
    pub kv_cache_block_size: Option<Spanned<u32>>,
    pub router_ttl_secs: Option<Spanned<f64>>,
    /// Only `false` is accepted: predicted state is what `kv` routing uses.
    pub router_use_kv_events: Option<Spanned<bool>>,
    pub active_decode_blocks_threshold: Option<Spanned<f64>>,
    pub active_prefill_tokens_threshold: Option<u64>,
    pub active_prefill_tokens_threshold_frac: Option<Spanned<f64>>,
    pub waiting_requests_threshold: Option<u64>,
    pub track_output_blocks: Option<bool>,
    /// The class of this model's requests that name none.
    pub class: Option<Spanned<String>>,
    pub adaptive_ttft_ms: Option<Spanned<f64>>,
    pub adaptive_min_scale: Option<Spanned<f64>>,
    pub adaptive_max_scale: Option<Spanned<f64>>,
    pub health_check: Option<FileHealthCheck>,
    /// The model's waiting room: its places, and how long a request may wait there.
    pub waiting_room_size: Option<Spanned<u32>>,
    pub waiting_room_timeout_ms: Option<Spanned<u64>>,
    /// How long a request that finds no worker available waits for one (a rollout).
    pub rollout_hold_ms: Option<Spanned<u64>>,
    /// Whether a request that finds every worker busy waits in the room (else the
    /// overload answer at once).
    pub waiting_room_waits_for_busy: Option<Spanned<bool>>,
    /// `"prefill"`: the entry is a prefill pool; `"decode"`: it names one (`prefill`).
    pub role: Option<Spanned<String>>,
    /// The prefill pool (a `role = "prefill"` entry's name) that runs stage 1.
    pub prefill: Option<Spanned<String>>,
    /// The engines' handoff between the stages (`vllm`).
    pub handoff: Option<Spanned<String>>,
    /// Prompts under this many uncached tokens skip stage 1.
    pub max_local_prefill_tokens: Option<u64>,
    #[serde(default)]
    pub workers: Vec<FileWorker>,
    pub dns: Option<FileDns>,
    pub etcd: Option<FileEtcd>,
    /// Settings of the workers a source finds (the keys of a listed worker but `url`,
    /// `name` and `metrics_url`).
    pub discovered: Option<FileWorker>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWorker {
    pub url: Option<Spanned<String>>,
    pub name: Option<Spanned<String>>,
    pub load_sources: Option<Spanned<Vec<String>>>,
    pub metrics_format: Option<Spanned<String>>,
    pub metrics_url: Option<Spanned<String>>,
    pub kv_total_blocks: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    /// The engine's slots (requests it runs at once, all ranks together).
    pub total_slots: Option<Spanned<u64>>,
    pub dp_size: Option<Spanned<u32>>,
    pub block_size: Option<Spanned<u32>>,
    pub engine_request_limit: Option<Spanned<u32>>,
    pub request_queue_limit: Option<Spanned<u32>>,
    pub request_queue_timeout_ms: Option<Spanned<u64>>,
    /// An SGLang prefill worker's bootstrap port.
    pub bootstrap_port: Option<Spanned<u16>>,
}

/// `[access_log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAccessLog {
    pub path: Option<Spanned<String>>,
    pub format: Option<Spanned<String>>,
    pub text_format: Option<Spanned<String>>,
    pub sample: Option<Spanned<u32>>,
    pub traceparent: Option<Spanned<String>>,
}
