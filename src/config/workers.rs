//! `[[models]]` and their `[[models.workers]]` checked into [`ModelConfig`]s and the
//! distinct [`WorkerConfig`]s they share (a worker listed by two models is one worker).

use super::file::{FileModel, FileWorker};
use super::validate::Validator;
use super::*;
use crate::http::limits::MAX_DP_SIZE;
use toml::Spanned;

/// Builds a worker key's path for error messages (`models[0].workers[1].url`).
pub(super) type Key<'a> = &'a dyn Fn(&str) -> String;

impl Validator<'_> {
    /// The adaptive mode's keys: a positive target enables it; it scales thresholds, so
    /// the model needs one, and the bounds must hold 1.
    fn adaptive(
        &self,
        key: Key<'_>,
        m: &FileModel,
        thresholds: &Thresholds,
    ) -> Result<Option<Adaptive>, ConfigError> {
        let bound = |k: &str, v: &Option<Spanned<f64>>, default: f64, ok: fn(f64) -> bool| match v {
            Some(s) if !(s.get_ref().is_finite() && ok(*s.get_ref())) => {
                let msg = "must be in (0, 1] for the minimum, [1, 64] for the maximum";
                self.err(key(k), Some(s.span()), msg)
            }
            Some(s) => Ok(*s.get_ref()),
            None => Ok(default),
        };
        let min_scale = bound(
            "adaptive_min_scale",
            &m.adaptive_min_scale,
            Adaptive::DEFAULT_MIN_SCALE,
            |v| v > 0.0 && v <= 1.0,
        )?;
        let max_scale = bound(
            "adaptive_max_scale",
            &m.adaptive_max_scale,
            Adaptive::DEFAULT_MAX_SCALE,
            |v| (1.0..=64.0).contains(&v),
        )?;
        let Some(target) = &m.adaptive_ttft_ms else {
            return Ok(None);
        };
        let ttft_ms = *target.get_ref();
        if !(ttft_ms.is_finite() && ttft_ms > 0.0) {
            return self.err(
                key("adaptive_ttft_ms"),
                Some(target.span()),
                "must be greater than 0",
            );
        }
        if !thresholds.any() {
            let msg = "the adaptive mode scales the busy thresholds: set at least one";
            return self.err(key("adaptive_ttft_ms"), Some(target.span()), msg);
        }
        Ok(Some(Adaptive {
            ttft_ms,
            min_scale,
            max_scale,
        }))
    }

    pub(super) fn models(
        &self,
        file: &[FileModel],
        o: &Overrides,
    ) -> Result<(Vec<ModelConfig>, Vec<WorkerConfig>), ConfigError> {
        let mut workers: Vec<WorkerConfig> = Vec::new();
        let mut models: Vec<ModelConfig> = Vec::new();
        for (mi, m) in file.iter().enumerate() {
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
        self.pools(&models, file)?;
        Ok((models, workers))
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
            Some(s) => RouterMode::parse(s.get_ref()).map_or_else(
                || {
                    let msg = format!(
                        "unknown router mode `{}` (expected one of: {})",
                        s.get_ref(),
                        RouterMode::NAMES
                    );
                    self.err(key("router_mode"), Some(s.span()), msg)
                },
                Ok,
            )?,
            None => o.router_mode.unwrap_or(RouterMode::RoundRobin),
        };
        let (role, disagg) = self.pool(&key, m)?;
        let thresholds = self.thresholds(&key, m, o)?;
        let kv = self.kv(&key, m, &o.kv)?;
        let discovery = self.discovery(&key, m, o)?;
        if m.workers.is_empty() && discovery.is_none() {
            return self.err(
                key("workers"),
                Some(m.name.span()),
                format!(
                    "model `{name}` has no workers (list some, or find them with `dns` or `etcd`)"
                ),
            );
        }
        let mut members = Vec::with_capacity(m.workers.len());
        for (wi, w) in m.workers.iter().enumerate() {
            let wkey = |k: &str| format!("models[{mi}].workers[{wi}].{k}");
            let idx = self.member(w, o, &wkey, workers)?;
            if members.contains(&idx) {
                let msg = format!(
                    "worker `{}` is listed twice for model `{name}`",
                    workers[idx].name
                );
                return self.err(wkey("url"), w.url.as_ref().map(|u| u.span()), msg);
            }
            members.push(idx);
        }
        Ok(ModelConfig {
            name,
            router_mode,
            kv,
            thresholds,
            track_output_blocks: m
                .track_output_blocks
                .or(o.track_output_blocks)
                .unwrap_or(false),
            class: match &m.class {
                Some(c) => Some(self.class(&key("class"), c)?),
                None => None,
            },
            adaptive: self.adaptive(&key, m, &thresholds)?,
            waiting_room: self.waiting_room(&key, m, router_mode)?,
            workers: members,
            discovery,
            health_check: None,
            role,
            disagg,
        })
    }

    /// The waiting room's keys: a size from 1 to [`WaitingRoom::MAX_SIZE`] enables it; a
    /// timeout needs a size; direct routing names its worker, so it has no room.
    fn waiting_room(
        &self,
        key: Key<'_>,
        m: &FileModel,
        mode: RouterMode,
    ) -> Result<Option<WaitingRoom>, ConfigError> {
        let timeout_ms = self.positive(
            &key("waiting_room_timeout_ms"),
            &m.waiting_room_timeout_ms,
            WaitingRoom::DEFAULT_TIMEOUT_MS,
        )?;
        let hold_ms = match &m.rollout_hold_ms {
            None => None,
            Some(_) => Some(self.positive(&key("rollout_hold_ms"), &m.rollout_hold_ms, 0)?),
        };
        let Some(size) = &m.waiting_room_size else {
            let msg = "the model has no waiting room: set `waiting_room_size` too";
            if let Some(t) = &m.waiting_room_timeout_ms {
                return self.err(key("waiting_room_timeout_ms"), Some(t.span()), msg);
            }
            if let Some(h) = &m.rollout_hold_ms {
                return self.err(key("rollout_hold_ms"), Some(h.span()), msg);
            }
            if let Some(b) = &m.waiting_room_waits_for_busy {
                return self.err(key("waiting_room_waits_for_busy"), Some(b.span()), msg);
            }
            return Ok(None);
        };
        let max = WaitingRoom::MAX_SIZE;
        match *size.get_ref() {
            n if n == 0 || n > max => {
                let msg = format!("must be between 1 and {max} (leave it unset for no room)");
                self.err(key("waiting_room_size"), Some(size.span()), msg)
            }
            _ if mode == RouterMode::Direct => {
                let msg = "direct routing names its worker: the model has no waiting room";
                self.err(key("waiting_room_size"), Some(size.span()), msg)
            }
            n => Ok(Some(WaitingRoom {
                size: n,
                timeout_ms,
                hold_ms,
                waits_for_busy: m
                    .waiting_room_waits_for_busy
                    .as_ref()
                    .is_some_and(|b| *b.get_ref()),
            })),
        }
    }

    /// The file's thresholds (validated with Dynamo's messages) over the flags' defaults.
    fn thresholds(
        &self,
        key: Key<'_>,
        m: &FileModel,
        o: &Overrides,
    ) -> Result<Thresholds, ConfigError> {
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
            waiting_requests_threshold: m.waiting_requests_threshold,
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
        Ok(thresholds)
    }

    /// The index of `w` among the distinct workers, adding it when new. A name already
    /// used by a different definition is an error.
    fn member(
        &self,
        w: &FileWorker,
        o: &Overrides,
        key: Key<'_>,
        workers: &mut Vec<WorkerConfig>,
    ) -> Result<usize, ConfigError> {
        let worker = self.worker(w, o, key)?;
        match workers.iter().position(|x| x.name == worker.name) {
            Some(i) if workers[i] != worker => {
                let msg = format!(
                    "worker name `{}` is already used by a different worker definition",
                    worker.name
                );
                self.err(key("name"), w.url.as_ref().map(|u| u.span()), msg)
            }
            Some(i) => Ok(i),
            None => {
                workers.push(worker);
                Ok(workers.len() - 1)
            }
        }
    }

    fn worker(
        &self,
        w: &FileWorker,
        o: &Overrides,
        key: Key<'_>,
    ) -> Result<WorkerConfig, ConfigError> {
        let Some(url) = &w.url else {
            return self.err(key("url"), None, "missing: a listed worker needs its `url`");
        };
        let (endpoint, tls) = parse_worker_url(url.get_ref())
            .or_else(|msg| self.err(key("url"), Some(url.span()), msg))?;
        if tls && w.metrics_url.is_none() && self.load_sources(w, key)?.scrape {
            let msg = "scraping an https:// worker needs an http:// `metrics_url`";
            return self.err(key("load_sources"), None, msg);
        }
        let mut worker = self.worker_at(w, endpoint, o, key)?;
        if tls {
            worker.tls = true;
            worker.url = format!("https://{}", worker.endpoint);
        }
        Ok(worker)
    }

    /// A worker's settings with its endpoint known (listed, or a discovered template's).
    pub(super) fn worker_at(
        &self,
        w: &FileWorker,
        endpoint: HostPort,
        o: &Overrides,
        key: Key<'_>,
    ) -> Result<WorkerConfig, ConfigError> {
        let name = match &w.name {
            Some(n) if n.get_ref().trim().is_empty() => {
                return self.err(key("name"), Some(n.span()), "must not be empty");
            }
            Some(n) => n.get_ref().trim().to_string(),
            None => endpoint.to_string(),
        };
        let (metrics, metrics_path) = self.metrics_endpoint(w, &endpoint, key)?;
        let (engine_request_limit, request_queue_limit) = self.admission(w, o, key)?;
        Ok(WorkerConfig {
            name,
            url: format!("http://{endpoint}"),
            tls: false,
            load_sources: self.load_sources(w, key)?,
            metrics_format: self.metrics_format(w, key)?,
            metrics,
            metrics_path,
            endpoint,
            kv_total_blocks: w.kv_total_blocks,
            max_num_batched_tokens: w.max_num_batched_tokens,
            total_slots: match &w.total_slots {
                Some(_) => Some(self.positive(&key("total_slots"), &w.total_slots, 0)?),
                None => None,
            },
            dp_size: match &w.dp_size {
                Some(s) if *s.get_ref() == 0 || *s.get_ref() > MAX_DP_SIZE => {
                    let msg = format!("must be between 1 and {MAX_DP_SIZE}");
                    return self.err(key("dp_size"), Some(s.span()), msg);
                }
                Some(s) => *s.get_ref(),
                None => 1,
            },
            block_size: self.positive(&key("block_size"), &w.block_size, DEFAULT_BLOCK_SIZE)?,
            engine_request_limit,
            request_queue_limit,
            request_queue_timeout_ms: self.positive(
                &key("request_queue_timeout_ms"),
                &w.request_queue_timeout_ms,
                DEFAULT_REQUEST_QUEUE_TIMEOUT_MS,
            )?,
            bootstrap_port: self.positive(
                &key("bootstrap_port"),
                &w.bootstrap_port,
                DEFAULT_BOOTSTRAP_PORT,
            )?,
        })
    }

    /// Push is always on; without `load_sources`, tracked is on too.
    fn load_sources(&self, w: &FileWorker, key: Key<'_>) -> Result<LoadSources, ConfigError> {
        let Some(list) = &w.load_sources else {
            return Ok(LoadSources {
                push: true,
                scrape: false,
                tracked: true,
            });
        };
        let mut sources = LoadSources {
            push: true,
            ..LoadSources::default()
        };
        for s in list.get_ref() {
            match s.as_str() {
                "push" => sources.push = true,
                "scrape" => sources.scrape = true,
                "tracked" => sources.tracked = true,
                other => {
                    let msg =
                        format!("unknown load source `{other}` (expected push, scrape, tracked)");
                    return self.err(key("load_sources"), Some(list.span()), msg);
                }
            }
        }
        Ok(sources)
    }

    fn metrics_format(&self, w: &FileWorker, key: Key<'_>) -> Result<MetricsFormat, ConfigError> {
        match w
            .metrics_format
            .as_ref()
            .map(|s| (s.get_ref().as_str(), s.span()))
        {
            None | Some(("vllm", _)) => Ok(MetricsFormat::Vllm),
            Some(("sglang", _)) => Ok(MetricsFormat::Sglang),
            Some(("llamacpp", _)) => Ok(MetricsFormat::Llamacpp),
            Some((other, span)) => {
                let msg =
                    format!("unknown metrics format `{other}` (expected vllm, sglang, llamacpp)");
                self.err(key("metrics_format"), Some(span), msg)
            }
        }
    }

    /// Where metrics are scraped: `metrics_url` (its path, `/metrics` by default), else
    /// the worker's own `/metrics`.
    fn metrics_endpoint(
        &self,
        w: &FileWorker,
        endpoint: &HostPort,
        key: Key<'_>,
    ) -> Result<(HostPort, String), ConfigError> {
        let Some(u) = &w.metrics_url else {
            return Ok((endpoint.clone(), "/metrics".to_string()));
        };
        let Ok(uri) = u.get_ref().parse::<http::Uri>() else {
            return self.err(key("metrics_url"), Some(u.span()), "not a URL");
        };
        let origin = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or(""),
            uri.authority().map(|a| a.as_str()).unwrap_or("")
        );
        let metrics = parse_http_url(&origin)
            .or_else(|msg| self.err(key("metrics_url"), Some(u.span()), msg))?;
        let path = match uri.path_and_query().map_or("/metrics", |p| p.as_str()) {
            "/" => "/metrics",
            p => p,
        };
        Ok((metrics, path.to_string()))
    }

    /// Engine slots N (file, else the flag) and queue places Q (at least 2, Spillway
    /// refuses what Dynamo silently floors).
    fn admission(
        &self,
        w: &FileWorker,
        o: &Overrides,
        key: Key<'_>,
    ) -> Result<(Option<u32>, u32), ConfigError> {
        let limit = match &w.engine_request_limit {
            Some(s) if *s.get_ref() == 0 => {
                let msg = "must be at least 1 (leave it unset for no cap)";
                return self.err(key("engine_request_limit"), Some(s.span()), msg);
            }
            Some(s) => Some(*s.get_ref()),
            None if o.engine_request_limit == Some(0) => {
                let flag = "--engine-request-limit / DYN_ENGINE_REQUEST_LIMIT";
                return self.err(flag, None, "must be at least 1");
            }
            None => o.engine_request_limit,
        };
        let queue = match &w.request_queue_limit {
            Some(s) if *s.get_ref() < 2 => {
                let msg = format!(
                    "must be at least 2, got {} (an exact N + Q cap needs Q >= 2)",
                    s.get_ref()
                );
                return self.err(key("request_queue_limit"), Some(s.span()), msg);
            }
            Some(s) => *s.get_ref(),
            None => match o.request_queue_limit {
                Some(q) if q < 2 => {
                    let msg = format!("must be at least 2, got {q}");
                    return self.err("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", None, msg);
                }
                Some(q) => q,
                None => DEFAULT_REQUEST_QUEUE_LIMIT,
            },
        };
        Ok((limit, queue))
    }
}
