//! The file's top level and `[limits]` checked into a [`Config`]; models and workers are in
//! `workers.rs`. Errors name the key and, where the file has a position for it, the line.

use std::ops::Range;

use toml::Spanned;

use super::file::{FileConfig, FileLimits};
use super::*;

pub(super) struct Validator<'a> {
    text: &'a str,
}

impl<'a> Validator<'a> {
    pub(super) fn new(text: &'a str) -> Validator<'a> {
        Validator { text }
    }

    fn line(&self, span: Range<usize>) -> usize {
        self.text
            .get(..span.start)
            .map_or(0, |t| t.bytes().filter(|&b| b == b'\n').count())
            + 1
    }

    pub(super) fn err<T>(
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

    /// `tenant_room_share`: above 0, at most 1, and only with a tenant header (without
    /// one every request is the same tenant).
    fn tenant_room_share(&self, f: &FileConfig) -> Result<f64, ConfigError> {
        let Some(share) = &f.tenant_room_share else {
            return Ok(1.0);
        };
        let key = "tenant_room_share";
        match *share.get_ref() {
            v if !(v > 0.0 && v <= 1.0) => self.err(
                key,
                Some(share.span()),
                "must be greater than 0 and at most 1",
            ),
            _ if f.tenant_header.is_none() => self.err(
                key,
                Some(share.span()),
                "requests have no tenant: set `tenant_header` too",
            ),
            v => Ok(v),
        }
    }

    /// `busy_spares_light_tenants`: true by default with a tenant header; only with one.
    fn busy_spares_light_tenants(&self, f: &FileConfig) -> Result<bool, ConfigError> {
        match &f.busy_spares_light_tenants {
            None => Ok(f.tenant_header.is_some()),
            Some(v) if f.tenant_header.is_none() => self.err(
                "busy_spares_light_tenants",
                Some(v.span()),
                "requests have no tenant: set `tenant_header` too",
            ),
            Some(v) => Ok(*v.get_ref()),
        }
    }

    pub(super) fn positive<T: Copy + PartialOrd + Default>(
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

    /// A header name (an RFC 9110 token), lowercased.
    pub(super) fn header_name(
        &self,
        key: &str,
        v: &Option<Spanned<String>>,
    ) -> Result<Option<String>, ConfigError> {
        let Some(h) = v else {
            return Ok(None);
        };
        let name = h.get_ref().trim().to_ascii_lowercase();
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            let msg = format!("`{}` is not a header name", h.get_ref());
            return self.err(key, Some(h.span()), msg);
        }
        Ok(Some(name))
    }

    fn host_port(
        &self,
        key: &str,
        v: &Option<Spanned<String>>,
        default: &str,
    ) -> Result<HostPort, ConfigError> {
        match v {
            Some(s) => {
                HostPort::parse(s.get_ref()).or_else(|msg| self.err(key, Some(s.span()), msg))
            }
            None => HostPort::parse(default).or_else(|msg| self.err(key, None, msg)),
        }
    }

    pub(super) fn config(&self, f: FileConfig, o: &Overrides) -> Result<Config, ConfigError> {
        let (cores, cpus) = self.cores(&f)?;
        let (mut models, workers) = self.models(&f.models, o)?;
        self.resolve_checks(&f, o, &mut models, &workers)?;
        Ok(Config {
            listen: self.host_port("listen", &f.listen, DEFAULT_LISTEN)?,
            admin_listen: self.host_port("admin_listen", &f.admin_listen, DEFAULT_ADMIN_LISTEN)?,
            cores,
            cpus,
            monitor_cpu: f.monitor_cpu,
            pin_cores: f.pin_cores.unwrap_or(true),
            overload_status_code: self.overload_status(&f, o)?,
            retry_after_secs: f.retry_after_secs.unwrap_or(DEFAULT_RETRY_AFTER_SECS),
            client_budget_header: self
                .header_name("client_budget_header", &f.client_budget_header)?,
            tenant_header: self.header_name("tenant_header", &f.tenant_header)?,
            tenant_room_share: self.tenant_room_share(&f)?,
            busy_spares_light_tenants: self.busy_spares_light_tenants(&f)?,
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
            retry_budget: self.retry_budget(&f)?,
            outlier: self.outlier(&f.outlier)?,
            drain_grace_ms: f.drain_grace_ms.unwrap_or(DEFAULT_DRAIN_GRACE_MS),
            drain_timeout_ms: f.drain_timeout_ms.unwrap_or(DEFAULT_DRAIN_TIMEOUT_MS),
            admin_token: self.admin_token(&f, o)?,
            limits: self.limits(&f.limits)?,
            classes: self.classes(&f.classes)?,
            access_log: self.access_log(&f.access_log)?,
            nats: self.nats(&f.nats)?,
            tls: self.tls(&f.tls, o)?,
            models,
            workers,
        })
    }

    fn cores(&self, f: &FileConfig) -> Result<(usize, Vec<usize>), ConfigError> {
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
        Ok((cores, cpus))
    }

    /// The environment's `DYN_HTTP_OVERLOAD_STATUS_CODE` (Dynamo's lenient parse) wins
    /// over the file (strict: a bad value is an error).
    fn overload_status(&self, f: &FileConfig, o: &Overrides) -> Result<u16, ConfigError> {
        match (&o.overload_status_env, &f.overload_status_code) {
            (Some(env), _) => Ok(parse_overload_status_env(env)),
            (None, Some(code)) if !(200..=999).contains(code.get_ref()) => self.err(
                "overload_status_code",
                Some(code.span()),
                format!("must be between 200 and 999, got {}", code.get_ref()),
            ),
            (None, Some(code)) => Ok(*code.get_ref()),
            (None, None) => Ok(DEFAULT_OVERLOAD_STATUS),
        }
    }

    fn admin_token(&self, f: &FileConfig, o: &Overrides) -> Result<Option<String>, ConfigError> {
        match (&o.admin_token_env, &f.admin_token) {
            (Some(t), _) if !t.trim().is_empty() => Ok(Some(t.trim().to_string())),
            (_, Some(t)) if t.get_ref().trim().is_empty() => self.err(
                "admin_token",
                Some(t.span()),
                "must not be empty (remove the key for no token)",
            ),
            (_, Some(t)) => Ok(Some(t.get_ref().trim().to_string())),
            (_, None) => Ok(None),
        }
    }

    fn limits(&self, l: &FileLimits) -> Result<Limits, ConfigError> {
        let d = Limits::default();
        let count = |key: &str, v: &Option<Spanned<usize>>, default: usize| {
            self.positive(&format!("limits.{key}"), v, default)
        };
        let limits = Limits {
            max_header_bytes: count("max_header_bytes", &l.max_header_bytes, d.max_header_bytes)?,
            max_body_bytes: count("max_body_bytes", &l.max_body_bytes, d.max_body_bytes)?,
            buffer_release_ms: l
                .buffer_release_ms
                .as_ref()
                .map_or(d.buffer_release_ms, |v| *v.get_ref()),
            max_connections: count("max_connections", &l.max_connections, d.max_connections)?,
            pool_idle_timeout_ms: l.pool_idle_timeout_ms.unwrap_or(d.pool_idle_timeout_ms),
            pool_max_idle_per_worker: l
                .pool_max_idle_per_worker
                .unwrap_or(d.pool_max_idle_per_worker),
            worker_refusal_hold_ms: l
                .worker_refusal_hold_ms
                .as_ref()
                .map_or(d.worker_refusal_hold_ms, |v| *v.get_ref()),
            admin_max_connections: count(
                "admin_max_connections",
                &l.admin_max_connections,
                d.admin_max_connections,
            )?,
            ..self.timeouts(l, d)?
        };
        if let Some(s) = l.max_header_bytes.as_ref().filter(|s| *s.get_ref() < 1024) {
            return self.err(
                "limits.max_header_bytes",
                Some(s.span()),
                "must be at least 1024",
            );
        }
        Ok(limits)
    }

    /// The `[limits]` timeouts (each greater than 0) over `d`, the other limits.
    fn timeouts(&self, l: &FileLimits, d: Limits) -> Result<Limits, ConfigError> {
        let ms = |key: &str, v: &Option<Spanned<u64>>, default: u64| {
            self.positive(&format!("limits.{key}"), v, default)
        };
        Ok(Limits {
            header_read_timeout_ms: ms(
                "header_read_timeout_ms",
                &l.header_read_timeout_ms,
                d.header_read_timeout_ms,
            )?,
            body_read_timeout_ms: ms(
                "body_read_timeout_ms",
                &l.body_read_timeout_ms,
                d.body_read_timeout_ms,
            )?,
            idle_timeout_ms: ms("idle_timeout_ms", &l.idle_timeout_ms, d.idle_timeout_ms)?,
            connect_timeout_ms: ms(
                "connect_timeout_ms",
                &l.connect_timeout_ms,
                d.connect_timeout_ms,
            )?,
            upstream_first_byte_timeout_ms: ms(
                "upstream_first_byte_timeout_ms",
                &l.upstream_first_byte_timeout_ms,
                d.upstream_first_byte_timeout_ms,
            )?,
            upstream_stream_idle_timeout_ms: ms(
                "upstream_stream_idle_timeout_ms",
                &l.upstream_stream_idle_timeout_ms,
                d.upstream_stream_idle_timeout_ms,
            )?,
            client_send_timeout_ms: ms(
                "client_send_timeout_ms",
                &l.client_send_timeout_ms,
                d.client_send_timeout_ms,
            )?,
            worker_down_backoff_ms: ms(
                "worker_down_backoff_ms",
                &l.worker_down_backoff_ms,
                d.worker_down_backoff_ms,
            )?,
            worker_down_backoff_max_ms: ms(
                "worker_down_backoff_max_ms",
                &l.worker_down_backoff_max_ms,
                d.worker_down_backoff_max_ms,
            )?,
            admin_read_timeout_ms: ms(
                "admin_read_timeout_ms",
                &l.admin_read_timeout_ms,
                d.admin_read_timeout_ms,
            )?,
            ..d
        })
    }
}

/// RFC 9110 token characters (header names).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
