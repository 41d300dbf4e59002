//! Configuration: the TOML file ([`file`]) validated into an immutable [`Config`]. Every
//! error names the key and, where the file has one, its line. Dynamo-named flags and
//! environment variables ([`Overrides`]) fill in what the file leaves unset.

pub mod file;
pub mod snapshot;

use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::path::Path;

use serde::Serialize;
use toml::Spanned;

use crate::http::Limits;
use crate::shed::Thresholds;
use file::{FileConfig, FileModel, FileWorker};

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
#[serde(rename_all = "kebab-case")]
pub enum RouterMode {
    RoundRobin,
    Random,
    PowerOfTwo,
    LeastLoaded,
    Direct,
}

impl RouterMode {
    pub const NAMES: &str = "round-robin, random, power-of-two, least-loaded, direct";

    pub fn parse(s: &str) -> Option<RouterMode> {
        Some(match s {
            "round-robin" => RouterMode::RoundRobin,
            "random" => RouterMode::Random,
            "power-of-two" => RouterMode::PowerOfTwo,
            "least-loaded" => RouterMode::LeastLoaded,
            "direct" => RouterMode::Direct,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsFormat {
    Vllm,
    Sglang,
    Llamacpp,
}

/// Where a worker's load comes from (semantics §2). Push is always accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LoadSources {
    pub push: bool,
    pub scrape: bool,
    pub tracked: bool,
}

/// Values from the Dynamo-named CLI flags and environment variables (semantics §9).
/// Per-model and per-worker keys in the file win over these.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub thresholds: Thresholds,
    pub router_mode: Option<RouterMode>,
    pub track_output_blocks: Option<bool>,
    /// Raw `DYN_HTTP_OVERLOAD_STATUS_CODE`, read once at start; overrides the file.
    pub overload_status_env: Option<String>,
    pub engine_request_limit: Option<u32>,
    pub request_queue_limit: Option<u32>,
    pub migration_limit: Option<u32>,
    /// `SPILLWAY_ADMIN_TOKEN`; overrides `admin_token` in the file.
    pub admin_token_env: Option<String>,
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
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub cores: usize,
    pub cpus: Vec<usize>,
    pub monitor_cpu: Option<usize>,
    pub pin_cores: bool,
    pub overload_status_code: u16,
    pub retry_after_secs: u32,
    pub load_staleness_ms: u64,
    pub scrape_interval_ms: u64,
    pub monitor_interval_ms: u64,
    /// Times a refused request may move to another worker (0 = never).
    pub migration_limit: u32,
    /// After SIGTERM: health answers 503 at once, listeners close after the grace, and
    /// requests in flight get up to the timeout to finish.
    pub drain_grace_ms: u64,
    pub drain_timeout_ms: u64,
    /// Bearer token the admin listener's mutating endpoints require (none = open).
    #[serde(skip_serializing)]
    pub admin_token: Option<String>,
    pub limits: Limits,
    pub models: Vec<ModelConfig>,
    /// Every distinct worker, by name; models refer to them by index.
    pub workers: Vec<WorkerConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub router_mode: RouterMode,
    pub thresholds: Thresholds,
    pub track_output_blocks: bool,
    /// Indices into [`Config::workers`].
    pub workers: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerConfig {
    pub name: String,
    pub url: String,
    pub addr: SocketAddr,
    pub load_sources: LoadSources,
    pub metrics_format: MetricsFormat,
    pub metrics_addr: SocketAddr,
    pub metrics_path: String,
    pub metrics_host: String,
    pub kv_total_blocks: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    pub dp_size: u32,
    pub block_size: u32,
    /// Engine slots (N); `None` = no admission cap.
    pub engine_request_limit: Option<u32>,
    /// Waiting places (Q) when N is set.
    pub request_queue_limit: u32,
    pub request_queue_timeout_ms: u64,
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
        Validator { text }.config(file, overrides)
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

struct Validator<'a> {
    text: &'a str,
}

impl Validator<'_> {
    fn line(&self, span: Range<usize>) -> usize {
        self.text
            .get(..span.start)
            .map_or(0, |t| t.bytes().filter(|&b| b == b'\n').count())
            + 1
    }

    fn err<T>(
        &self,
        key: impl Into<String>,
        span: Option<Range<usize>>,
        msg: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(ConfigError::Invalid {
            key: key.into(),
            line: span.map(|s| self.line(s)),
            msg: msg.into(),
        })
    }

    fn positive<T: Copy + PartialOrd + Default>(
        &self,
        key: &str,
        v: &Option<Spanned<T>>,
        default: T,
    ) -> Result<T, ConfigError> {
        match v {
            Some(s) if *s.get_ref() <= T::default() => {
                self.err(key, Some(s.span()), "must be greater than 0")
            }
            Some(s) => Ok(*s.get_ref()),
            None => Ok(default),
        }
    }

    fn addr(
        &self,
        key: &str,
        v: &Option<Spanned<String>>,
        default: &str,
    ) -> Result<SocketAddr, ConfigError> {
        let (text, span) = match v {
            Some(s) => (s.get_ref().as_str(), Some(s.span())),
            None => (default, None),
        };
        match text.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(a)) => Ok(a),
            Ok(None) => self.err(key, span, format!("`{text}` resolves to no address")),
            Err(e) => self.err(
                key,
                span,
                format!("`{text}` is not a host:port address: {e}"),
            ),
        }
    }

    fn config(&self, f: FileConfig, o: &Overrides) -> Result<Config, ConfigError> {
        let l = &f.limits;
        let d = Limits::default();
        let limits = Limits {
            max_header_bytes: self.positive(
                "limits.max_header_bytes",
                &l.max_header_bytes,
                d.max_header_bytes,
            )?,
            max_body_bytes: self.positive(
                "limits.max_body_bytes",
                &l.max_body_bytes,
                d.max_body_bytes,
            )?,
            header_read_timeout_ms: self.positive(
                "limits.header_read_timeout_ms",
                &l.header_read_timeout_ms,
                d.header_read_timeout_ms,
            )?,
            idle_timeout_ms: self.positive(
                "limits.idle_timeout_ms",
                &l.idle_timeout_ms,
                d.idle_timeout_ms,
            )?,
            connect_timeout_ms: self.positive(
                "limits.connect_timeout_ms",
                &l.connect_timeout_ms,
                d.connect_timeout_ms,
            )?,
            upstream_first_byte_timeout_ms: self.positive(
                "limits.upstream_first_byte_timeout_ms",
                &l.upstream_first_byte_timeout_ms,
                d.upstream_first_byte_timeout_ms,
            )?,
            max_connections: self.positive(
                "limits.max_connections",
                &l.max_connections,
                d.max_connections,
            )?,
            pool_idle_timeout_ms: l.pool_idle_timeout_ms.unwrap_or(d.pool_idle_timeout_ms),
            pool_max_idle_per_worker: l
                .pool_max_idle_per_worker
                .unwrap_or(d.pool_max_idle_per_worker),
            worker_down_backoff_ms: self.positive(
                "limits.worker_down_backoff_ms",
                &l.worker_down_backoff_ms,
                d.worker_down_backoff_ms,
            )?,
            worker_down_backoff_max_ms: self.positive(
                "limits.worker_down_backoff_max_ms",
                &l.worker_down_backoff_max_ms,
                d.worker_down_backoff_max_ms,
            )?,
        };
        if let Some(s) = l.max_header_bytes.as_ref().filter(|s| *s.get_ref() < 1024) {
            return self.err(
                "limits.max_header_bytes",
                Some(s.span()),
                "must be at least 1024",
            );
        }

        let overload_status_code = match (&o.overload_status_env, &f.overload_status_code) {
            (Some(env), _) => parse_overload_status_env(env),
            (None, Some(code)) if !(200..=999).contains(code.get_ref()) => {
                return self.err(
                    "overload_status_code",
                    Some(code.span()),
                    format!("must be between 200 and 999, got {}", code.get_ref()),
                );
            }
            (None, Some(code)) => *code.get_ref(),
            (None, None) => DEFAULT_OVERLOAD_STATUS,
        };

        let cores = match f.cores {
            None | Some(0) => default_cores(),
            Some(n) => n,
        };
        let cpus = f.cpus.clone().unwrap_or_default();
        if !cpus.is_empty() && cpus.len() != cores {
            return self.err(
                "cpus",
                None,
                format!("lists {} CPUs for {cores} cores", cpus.len()),
            );
        }

        let mut workers: Vec<WorkerConfig> = Vec::new();
        let mut models: Vec<ModelConfig> = Vec::new();
        for (mi, m) in f.models.iter().enumerate() {
            let model = self.model(mi, m, o, &mut workers)?;
            if models.iter().any(|x| x.name == model.name) {
                return self.err(
                    format!("models[{mi}].name"),
                    Some(m.name.span()),
                    format!("model `{}` is defined twice", model.name),
                );
            }
            models.push(model);
        }

        Ok(Config {
            listen: self.addr("listen", &f.listen, DEFAULT_LISTEN)?,
            admin_listen: self.addr("admin_listen", &f.admin_listen, DEFAULT_ADMIN_LISTEN)?,
            cores,
            cpus,
            monitor_cpu: f.monitor_cpu,
            pin_cores: f.pin_cores.unwrap_or(true),
            overload_status_code,
            retry_after_secs: f.retry_after_secs.unwrap_or(DEFAULT_RETRY_AFTER_SECS),
            load_staleness_ms: self.positive(
                "load_staleness_ms",
                &f.load_staleness_ms,
                DEFAULT_LOAD_STALENESS_MS,
            )?,
            scrape_interval_ms: self.positive(
                "scrape_interval_ms",
                &f.scrape_interval_ms,
                DEFAULT_SCRAPE_INTERVAL_MS,
            )?,
            monitor_interval_ms: self.positive(
                "monitor_interval_ms",
                &f.monitor_interval_ms,
                DEFAULT_MONITOR_INTERVAL_MS,
            )?,
            migration_limit: f
                .migration_limit
                .or(o.migration_limit)
                .unwrap_or(DEFAULT_MIGRATION_LIMIT),
            drain_grace_ms: f.drain_grace_ms.unwrap_or(DEFAULT_DRAIN_GRACE_MS),
            drain_timeout_ms: f.drain_timeout_ms.unwrap_or(DEFAULT_DRAIN_TIMEOUT_MS),
            admin_token: match (&o.admin_token_env, &f.admin_token) {
                (Some(t), _) if !t.trim().is_empty() => Some(t.trim().to_string()),
                (_, Some(t)) if t.get_ref().trim().is_empty() => {
                    return self.err(
                        "admin_token",
                        Some(t.span()),
                        "must not be empty (remove the key for no token)",
                    );
                }
                (_, Some(t)) => Some(t.get_ref().trim().to_string()),
                (_, None) => None,
            },
            limits,
            models,
            workers,
        })
    }

    fn model(
        &self,
        mi: usize,
        m: &FileModel,
        o: &Overrides,
        workers: &mut Vec<WorkerConfig>,
    ) -> Result<ModelConfig, ConfigError> {
        let key = |k: &str| format!("models[{mi}].{k}");
        let name = m.name.get_ref().trim().to_string();
        if name.is_empty() {
            return self.err(key("name"), Some(m.name.span()), "must not be empty");
        }
        let router_mode = match &m.router_mode {
            Some(s) => match RouterMode::parse(s.get_ref()) {
                Some(mode) => mode,
                None => {
                    return self.err(
                        key("router_mode"),
                        Some(s.span()),
                        format!(
                            "unknown router mode `{}` (expected one of: {})",
                            s.get_ref(),
                            RouterMode::NAMES
                        ),
                    );
                }
            },
            None => o.router_mode.unwrap_or(RouterMode::RoundRobin),
        };
        let file_thresholds = Thresholds {
            active_decode_blocks_threshold: m
                .active_decode_blocks_threshold
                .as_ref()
                .map(|s| *s.get_ref()),
            active_prefill_tokens_threshold: m.active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac: m
                .active_prefill_tokens_threshold_frac
                .as_ref()
                .map(|s| *s.get_ref()),
        };
        if let Err(msg) = file_thresholds.validate() {
            let span = m
                .active_decode_blocks_threshold
                .as_ref()
                .filter(|_| msg.starts_with("active_decode"))
                .or(m.active_prefill_tokens_threshold_frac.as_ref())
                .map(|s| s.span());
            return self.err(key("thresholds"), span, msg);
        }
        let thresholds = o.thresholds.merged(&file_thresholds);
        if let Err(msg) = thresholds.validate() {
            return self.err("command-line/environment thresholds", None, msg);
        }
        if m.workers.is_empty() {
            return self.err(
                key("workers"),
                Some(m.name.span()),
                format!("model `{name}` has no workers"),
            );
        }
        let mut members = Vec::with_capacity(m.workers.len());
        for (wi, w) in m.workers.iter().enumerate() {
            let wkey = |k: &str| format!("models[{mi}].workers[{wi}].{k}");
            let worker = self.worker(w, o, &wkey)?;
            let idx = match workers.iter().position(|x| x.name == worker.name) {
                Some(i) if workers[i] != worker => {
                    return self.err(
                        wkey("name"),
                        Some(w.url.span()),
                        format!(
                            "worker name `{}` is already used by a different worker definition",
                            worker.name
                        ),
                    );
                }
                Some(i) => i,
                None => {
                    workers.push(worker);
                    workers.len() - 1
                }
            };
            if members.contains(&idx) {
                return self.err(
                    wkey("url"),
                    Some(w.url.span()),
                    format!(
                        "worker `{}` is listed twice for model `{name}`",
                        workers[idx].name
                    ),
                );
            }
            members.push(idx);
        }
        Ok(ModelConfig {
            name,
            router_mode,
            thresholds,
            track_output_blocks: m
                .track_output_blocks
                .or(o.track_output_blocks)
                .unwrap_or(false),
            workers: members,
        })
    }

    fn worker(
        &self,
        w: &FileWorker,
        o: &Overrides,
        key: &dyn Fn(&str) -> String,
    ) -> Result<WorkerConfig, ConfigError> {
        let (host, port) = match parse_http_url(w.url.get_ref()) {
            Ok(hp) => hp,
            Err(msg) => return self.err(key("url"), Some(w.url.span()), msg),
        };
        let addr = match (host.as_str(), port)
            .to_socket_addrs()
            .map(|mut a| a.next())
        {
            Ok(Some(a)) => a,
            Ok(None) | Err(_) => {
                return self.err(
                    key("url"),
                    Some(w.url.span()),
                    format!("cannot resolve `{host}`"),
                );
            }
        };
        let name = match &w.name {
            Some(n) if n.get_ref().trim().is_empty() => {
                return self.err(key("name"), Some(n.span()), "must not be empty");
            }
            Some(n) => n.get_ref().trim().to_string(),
            None => format!("{host}:{port}"),
        };
        let mut load_sources = LoadSources {
            push: true,
            scrape: false,
            tracked: true,
        };
        if let Some(list) = &w.load_sources {
            load_sources = LoadSources {
                push: true,
                ..LoadSources::default()
            };
            for s in list.get_ref() {
                match s.as_str() {
                    "push" => load_sources.push = true,
                    "scrape" => load_sources.scrape = true,
                    "tracked" => load_sources.tracked = true,
                    other => {
                        return self.err(
                            key("load_sources"),
                            Some(list.span()),
                            format!(
                                "unknown load source `{other}` (expected push, scrape, tracked)"
                            ),
                        );
                    }
                }
            }
        }
        let metrics_format = match w
            .metrics_format
            .as_ref()
            .map(|s| (s.get_ref().as_str(), s.span()))
        {
            None | Some(("vllm", _)) => MetricsFormat::Vllm,
            Some(("sglang", _)) => MetricsFormat::Sglang,
            Some(("llamacpp", _)) => MetricsFormat::Llamacpp,
            Some((other, span)) => {
                return self.err(
                    key("metrics_format"),
                    Some(span),
                    format!("unknown metrics format `{other}` (expected vllm, sglang, llamacpp)"),
                );
            }
        };
        let (metrics_addr, metrics_host, metrics_path) = match &w.metrics_url {
            None => (addr, format!("{host}:{port}"), "/metrics".to_string()),
            Some(u) => {
                let Ok(uri) = u.get_ref().parse::<http::Uri>() else {
                    return self.err(key("metrics_url"), Some(u.span()), "not a URL");
                };
                let (mh, mp) = match parse_http_url(&format!(
                    "{}://{}",
                    uri.scheme_str().unwrap_or(""),
                    uri.authority().map(|a| a.as_str()).unwrap_or("")
                )) {
                    Ok(hp) => hp,
                    Err(msg) => return self.err(key("metrics_url"), Some(u.span()), msg),
                };
                let Ok(Some(ma)) = (mh.as_str(), mp).to_socket_addrs().map(|mut a| a.next()) else {
                    return self.err(
                        key("metrics_url"),
                        Some(u.span()),
                        format!("cannot resolve `{mh}`"),
                    );
                };
                let path = uri.path_and_query().map_or("/metrics", |p| p.as_str());
                (
                    ma,
                    format!("{mh}:{mp}"),
                    if path == "/" {
                        "/metrics".into()
                    } else {
                        path.into()
                    },
                )
            }
        };
        let dp_size = match &w.dp_size {
            Some(s) if *s.get_ref() == 0 || *s.get_ref() > 1024 => {
                return self.err(key("dp_size"), Some(s.span()), "must be between 1 and 1024");
            }
            Some(s) => *s.get_ref(),
            None => 1,
        };
        let block_size = self.positive(&key("block_size"), &w.block_size, DEFAULT_BLOCK_SIZE)?;
        let engine_request_limit = match &w.engine_request_limit {
            Some(s) if *s.get_ref() == 0 => {
                return self.err(
                    key("engine_request_limit"),
                    Some(s.span()),
                    "must be at least 1 (leave it unset for no cap)",
                );
            }
            Some(s) => Some(*s.get_ref()),
            None if o.engine_request_limit == Some(0) => {
                return self.err(
                    "--engine-request-limit / DYN_ENGINE_REQUEST_LIMIT",
                    None,
                    "must be at least 1",
                );
            }
            None => o.engine_request_limit,
        };
        let request_queue_limit = match &w.request_queue_limit {
            Some(s) if *s.get_ref() < 2 => {
                return self.err(
                    key("request_queue_limit"),
                    Some(s.span()),
                    format!(
                        "must be at least 2, got {} (an exact N + Q cap needs Q >= 2)",
                        s.get_ref()
                    ),
                );
            }
            Some(s) => *s.get_ref(),
            None => match o.request_queue_limit {
                Some(q) if q < 2 => {
                    return self.err(
                        "DYN_DYNAMO_REQUEST_QUEUE_LIMIT",
                        None,
                        format!("must be at least 2, got {q}"),
                    );
                }
                Some(q) => q,
                None => DEFAULT_REQUEST_QUEUE_LIMIT,
            },
        };
        let request_queue_timeout_ms = self.positive(
            &key("request_queue_timeout_ms"),
            &w.request_queue_timeout_ms,
            DEFAULT_REQUEST_QUEUE_TIMEOUT_MS,
        )?;
        Ok(WorkerConfig {
            name,
            url: format!("http://{host}:{port}"),
            addr,
            load_sources,
            metrics_format,
            metrics_addr,
            metrics_path,
            metrics_host,
            kv_total_blocks: w.kv_total_blocks,
            max_num_batched_tokens: w.max_num_batched_tokens,
            dp_size,
            block_size,
            engine_request_limit,
            request_queue_limit,
            request_queue_timeout_ms,
        })
    }
}

/// `http://host:port[/]` → (host, port). HTTPS and base paths are refused with a reason.
pub(crate) fn parse_http_url(url: &str) -> Result<(String, u16), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "`{url}`: https upstreams are not supported (use http)"
            ));
        }
        _ => return Err(format!("`{url}` must start with http://")),
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!(
            "`{url}`: a base path is not supported; requests keep their own path"
        ));
    }
    if uri.query().is_some() {
        return Err(format!("`{url}`: a query string is not supported"));
    }
    let host = uri.host().ok_or_else(|| format!("`{url}` has no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, uri.port_u16().unwrap_or(80)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, &Overrides::default())
    }

    const MIN: &str =
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:8001\"\n";

    #[test]
    fn documented_example_is_valid() {
        let c = parse(EXAMPLE_CONFIG).unwrap();
        assert!(!c.models.is_empty());
    }

    #[test]
    fn minimal_defaults() {
        let c = parse(MIN).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8000".parse().unwrap());
        assert_eq!(c.admin_listen, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(c.overload_status_code, 529);
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.workers[0].name, "127.0.0.1:8001");
        assert_eq!(c.models[0].router_mode, RouterMode::RoundRobin);
        assert!(c.cores >= 1);
    }

    #[test]
    fn errors_name_key_and_line() {
        let cases: &[(&str, &str)] = &[
            ("bogus = 1\n", "unknown field `bogus`"),
            ("[limits]\nmax_body_bytes = \"x\"\n", "line 2"),
            (
                "[limits]\nmax_body_bytes = 0\n",
                "limits.max_body_bytes (line 2): must be greater than 0",
            ),
            ("listen = \"nope\"\n", "listen (line 1)"),
            (
                "[[models]]\nname = \"m\"\nrouter_mode = \"kv\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
                "models[0].router_mode (line 3): unknown router mode `kv`",
            ),
            (
                "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"https://127.0.0.1:1\"\n",
                "models[0].workers[0].url (line 4): `https://127.0.0.1:1`: https upstreams are not supported",
            ),
            (
                "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1/base\"\n",
                "a base path is not supported",
            ),
            (
                "[[models]]\nname = \"m\"\n",
                "models[0].workers (line 2): model `m` has no workers",
            ),
            (
                "[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 1.5\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
                "(line 3): active_decode_blocks_threshold must be between 0.0 and 1.0, got 1.5",
            ),
            (
                "overload_status_code = 150\n",
                "overload_status_code (line 1): must be between 200 and 999, got 150",
            ),
            (
                "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nengine_request_limit = 2\nrequest_queue_limit = 1\n",
                "models[0].workers[0].request_queue_limit (line 6): must be at least 2, got 1",
            ),
            (
                "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nengine_request_limit = 0\n",
                "models[0].workers[0].engine_request_limit (line 5): must be at least 1",
            ),
            (
                "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
                "listed twice",
            ),
            (
                "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nname = \"w\"\n[[models]]\nname = \"n\"\n[[models.workers]]\nurl = \"http://127.0.0.1:2\"\nname = \"w\"\n",
                "worker name `w` is already used",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}\n  got: {err}\n  want: {want}");
        }
    }

    #[test]
    fn shared_worker_is_one_worker() {
        let c = parse("[[models]]\nname = \"a\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n[[models]]\nname = \"b\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n").unwrap();
        assert_eq!(c.workers.len(), 1);
        assert_eq!(c.models[1].workers, vec![0]);
    }

    #[test]
    fn overload_status_env_rules() {
        for (v, want) in [
            ("503", 503),
            (" 429 ", 429),
            ("200", 200),
            ("999", 999),
            ("", 529),
            ("abc", 529),
            ("100", 529),
            ("199", 529),
            ("99", 529),
            ("1000", 529),
            ("-1", 529),
        ] {
            assert_eq!(parse_overload_status_env(v), want, "{v:?}");
        }
        let o = Overrides {
            overload_status_env: Some("503".into()),
            ..Overrides::default()
        };
        let c = Config::parse(&format!("overload_status_code = 429\n{MIN}"), &o).unwrap();
        assert_eq!(c.overload_status_code, 503);
        let c = parse(&format!("overload_status_code = 429\n{MIN}")).unwrap();
        assert_eq!(c.overload_status_code, 429);
    }

    #[test]
    fn overrides_fill_in_where_file_is_silent() {
        let o = Overrides {
            thresholds: Thresholds {
                active_decode_blocks_threshold: Some(0.5),
                active_prefill_tokens_threshold: Some(10),
                ..Thresholds::default()
            },
            router_mode: Some(RouterMode::Random),
            track_output_blocks: Some(true),
            ..Overrides::default()
        };
        let text = "[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.9\nrouter_mode = \"direct\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n";
        let c = Config::parse(text, &o).unwrap();
        let m = &c.models[0];
        assert_eq!(m.thresholds.active_decode_blocks_threshold, Some(0.9));
        assert_eq!(m.thresholds.active_prefill_tokens_threshold, Some(10));
        assert_eq!(m.router_mode, RouterMode::Direct);
        assert!(m.track_output_blocks);
    }

    #[test]
    fn effective_config_round_trips_through_toml() {
        let c = parse(EXAMPLE_CONFIG).unwrap();
        let text = c.to_toml();
        assert!(text.contains("listen = \"127.0.0.1:8000\""), "{text}");
    }
}
