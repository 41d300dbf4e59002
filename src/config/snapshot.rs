//! The runtime snapshot: one immutable value per config generation, shared by every core
//! behind an `ArcSwap` and pinned by each connection for its lifetime. The [`Registry`]
//! builds snapshots and carries per-worker state (atomics, stable ids) from one generation
//! to the next, so a reload keeps pools, load and counters of unchanged workers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::{Config, ModelConfig, RouterMode, WorkerConfig};
use crate::admission::{AT_CAPACITY, Gate, QUEUE_TIMEOUT};
use crate::http::canned::Canned;
use crate::metrics::ModelMetrics;

/// Immutable runtime view of one config generation.
#[derive(Debug)]
pub struct Snapshot {
    pub generation: u64,
    pub config: Config,
    pub models: Box<[Model]>,
    model_index: HashMap<Box<[u8]>, usize>,
    worker_index: HashMap<Box<str>, usize>,
    /// Same order as `config.workers`.
    pub workers: Box<[Worker]>,
    pub responses: Responses,
}

impl Snapshot {
    /// Looks a worker up by its configured name (load events, direct routing).
    pub fn worker_named(&self, name: &str) -> Option<&Worker> {
        self.worker_index.get(name).map(|&i| &self.workers[i])
    }

    /// Looks a model up by its decoded name.
    #[inline]
    pub fn model(&self, name: &[u8]) -> Option<&Model> {
        self.model_index.get(name).map(|&i| &self.models[i])
    }
}

#[derive(Debug)]
pub struct Model {
    pub name: Box<str>,
    /// Stable across reloads while the model exists.
    pub id: u32,
    pub router_mode: RouterMode,
    pub track_output_blocks: bool,
    pub members: Box<[Member]>,
    pub metrics: Arc<ModelMetrics>,
}

/// One worker in one model's pool.
#[derive(Debug, Clone, Copy)]
pub struct Member {
    /// Index into [`Snapshot::workers`].
    pub worker: u32,
    /// Stable id of the (model, worker) pair: its bit in the published busy set.
    pub id: u32,
}

#[derive(Debug)]
pub struct Worker {
    pub cfg: WorkerConfig,
    pub state: Arc<WorkerState>,
    /// Engine slots and overflow queue, when `engine_request_limit` is set.
    pub gate: Option<Arc<Gate>>,
}

/// Per-worker state shared by all cores, kept across reloads while the worker is unchanged.
#[derive(Debug)]
pub struct WorkerState {
    /// Stable id: index of the worker's pools and per-core slots on every core.
    pub slot: u32,
    pub name: Box<str>,
    /// Monotonic ms (see [`crate::core::clock`]) until which the worker is skipped.
    down_until_ms: AtomicU64,
    failures: AtomicU32,
    /// Busy-set generation in which the worker refused a request (WorkerOverloaded): it is
    /// skipped until the monitor publishes the next generation.
    overloaded_in: AtomicU64,
    /// One entry per core, written only by that core: what it routed and has not finished.
    pub tracked: Box<[CachePadded<TrackedLoad>]>,
}

/// Router-side load one core has sent to one worker.
#[derive(Debug, Default)]
pub struct TrackedLoad {
    pub inflight: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub decode_blocks: AtomicU64,
}

impl WorkerState {
    fn new(slot: u32, name: &str, cores: usize) -> WorkerState {
        WorkerState {
            slot,
            name: name.into(),
            down_until_ms: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            overloaded_in: AtomicU64::new(u64::MAX),
            tracked: (0..cores)
                .map(|_| CachePadded::new(TrackedLoad::default()))
                .collect(),
        }
    }

    #[inline]
    pub fn is_down(&self, now_ms: u64) -> bool {
        self.down_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// Records a failed connect: down for `base << (failures-1)` ms, capped at `max`.
    pub fn mark_down(&self, now_ms: u64, base_ms: u64, max_ms: u64) -> u64 {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let backoff = base_ms
            .saturating_mul(1u64 << (failures - 1).min(20))
            .min(max_ms);
        self.down_until_ms
            .store(now_ms + backoff, Ordering::Relaxed);
        backoff
    }

    /// Marks a local refusal; cleared by the next busy-set publication.
    pub fn mark_overloaded(&self, generation: u64) {
        self.overloaded_in.store(generation, Ordering::Relaxed);
    }

    #[inline]
    pub fn is_overloaded(&self, generation: u64) -> bool {
        self.overloaded_in.load(Ordering::Relaxed) == generation
    }

    /// Inhibits a worker that answered 503 for `ms` (it is skipped like a down worker).
    pub fn inhibit(&self, now_ms: u64, ms: u64) {
        self.down_until_ms.fetch_max(now_ms + ms, Ordering::Relaxed);
    }

    /// A successful connect clears the backoff.
    #[inline]
    pub fn mark_up(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
            self.down_until_ms.store(0, Ordering::Relaxed);
        }
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Sum over cores of requests in flight.
    pub fn inflight_total(&self) -> u64 {
        self.tracked
            .iter()
            .map(|t| t.inflight.load(Ordering::Relaxed))
            .sum()
    }
}

/// The responses the data path answers itself, rendered once per generation.
#[derive(Debug)]
pub struct Responses {
    pub models: Canned,
    pub overloaded: Canned,
    pub direct_busy: Canned,
    pub unavailable: Canned,
    pub model_not_found: Canned,
    pub not_found: Canned,
    pub too_many_connections: Canned,
    pub worker_at_capacity: Canned,
    pub queue_timeout: Canned,
}

impl Responses {
    fn new(config: &Config, created: u64) -> Responses {
        let retry = config.retry_after_secs.to_string();
        let retry = [("retry-after", retry.as_str())];
        let code = config.overload_status_code;
        let data: Vec<_> = config
            .models
            .iter()
            .map(|m| serde_json::json!({"id": m.name, "object": "model", "created": created, "owned_by": "spillway"}))
            .collect();
        let models = serde_json::json!({"object": "list", "data": data}).to_string();
        Responses {
            models: Canned::json(200, models.into_bytes(), &[]),
            overloaded: Canned::error_typed(
                code,
                "Service temporarily overloaded",
                "Overloaded",
                &retry,
            ),
            direct_busy: Canned::error_typed(
                code,
                "Selected worker is overloaded, please retry later",
                "Overloaded",
                &retry,
            ),
            unavailable: Canned::error(503, "Service temporarily unavailable", &retry),
            model_not_found: Canned::error(404, "Model not found", &[]),
            not_found: Canned::error(404, "Not found", &[]),
            too_many_connections: Canned::error(503, "Too many connections", &retry),
            worker_at_capacity: Canned::error_typed(code, AT_CAPACITY, "Overloaded", &retry),
            queue_timeout: Canned::error_typed(code, QUEUE_TIMEOUT, "Overloaded", &retry),
        }
    }
}

/// Builds snapshots and remembers stable ids and shared state between them.
#[derive(Debug)]
pub struct Registry {
    cores: usize,
    generation: u64,
    created: u64,
    next_slot: u32,
    workers: HashMap<(String, String), Arc<WorkerState>>,
    gates: HashMap<(String, String), (u32, u32, Arc<Gate>)>,
    model_ids: HashMap<String, u32>,
    model_metrics: HashMap<String, Arc<ModelMetrics>>,
    member_ids: HashMap<(String, String), u32>,
}

impl Registry {
    pub fn new(cores: usize) -> Registry {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Registry {
            cores,
            generation: 0,
            created,
            next_slot: 0,
            workers: HashMap::new(),
            gates: HashMap::new(),
            model_ids: HashMap::new(),
            model_metrics: HashMap::new(),
            member_ids: HashMap::new(),
        }
    }

    pub fn cores(&self) -> usize {
        self.cores
    }

    /// Number of worker slots ever handed out (bound for per-slot tables).
    pub fn slots(&self) -> u32 {
        self.next_slot
    }

    /// Number of member ids ever handed out (bound for the busy bitmap).
    pub fn member_ids(&self) -> u32 {
        self.member_ids.len() as u32
    }

    pub fn build(&mut self, config: Config) -> Snapshot {
        self.generation += 1;
        let workers: Box<[Worker]> = config
            .workers
            .iter()
            .map(|w| {
                let key = (w.name.clone(), w.url.clone());
                let state = match self.workers.get(&key) {
                    Some(s) => s.clone(),
                    None => {
                        let s = Arc::new(WorkerState::new(self.next_slot, &w.name, self.cores));
                        self.next_slot += 1;
                        self.workers.insert(key.clone(), s.clone());
                        s
                    }
                };
                // A gate survives a reload while its limits do; new limits start a new gate
                // (requests admitted by the old one finish under it).
                let gate = w.engine_request_limit.map(|n| {
                    let q = w.request_queue_limit;
                    match self.gates.get(&key) {
                        Some((gn, gq, g)) if (*gn, *gq) == (n, q) => g.clone(),
                        _ => {
                            let g = Arc::new(Gate::new(n, q));
                            self.gates.insert(key.clone(), (n, q, g.clone()));
                            g
                        }
                    }
                });
                if gate.is_none() {
                    self.gates.remove(&key);
                }
                Worker {
                    cfg: w.clone(),
                    state,
                    gate,
                }
            })
            .collect();
        let models: Box<[Model]> = config
            .models
            .iter()
            .map(|m| self.model(m, &config))
            .collect();
        let model_index = models
            .iter()
            .enumerate()
            .map(|(i, m)| (Box::<[u8]>::from(m.name.as_bytes()), i))
            .collect();
        // Forget workers no longer configured so a re-added one starts clean.
        let live: std::collections::HashSet<(String, String)> = config
            .workers
            .iter()
            .map(|w| (w.name.clone(), w.url.clone()))
            .collect();
        self.workers.retain(|k, _| live.contains(k));
        self.gates.retain(|k, _| live.contains(k));
        let worker_index = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (Box::<str>::from(w.cfg.name.as_str()), i))
            .collect();
        let responses = Responses::new(&config, self.created);
        Snapshot {
            generation: self.generation,
            config,
            models,
            model_index,
            worker_index,
            workers,
            responses,
        }
    }

    fn model(&mut self, m: &ModelConfig, config: &Config) -> Model {
        let next_model = self.model_ids.len() as u32;
        let id = *self.model_ids.entry(m.name.clone()).or_insert(next_model);
        let cores = self.cores;
        let metrics = self
            .model_metrics
            .entry(m.name.clone())
            .or_insert_with(|| Arc::new(ModelMetrics::new(cores)))
            .clone();
        let members = m
            .workers
            .iter()
            .map(|&wi| {
                let w = &config.workers[wi];
                let next = self.member_ids.len() as u32;
                let key = (m.name.clone(), format!("{}\u{0}{}", w.name, w.url));
                let id = *self.member_ids.entry(key).or_insert(next);
                Member {
                    worker: wi as u32,
                    id,
                }
            })
            .collect();
        Model {
            name: m.name.as_str().into(),
            id,
            router_mode: m.router_mode,
            track_output_blocks: m.track_output_blocks,
            members,
            metrics,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    fn cfg(text: &str) -> Config {
        Config::parse(text, &Overrides::default()).unwrap()
    }

    const TWO: &str = "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nname = \"a\"\n[[models.workers]]\nurl = \"http://127.0.0.1:2\"\nname = \"b\"\n";

    #[test]
    fn reload_keeps_state_of_unchanged_workers() {
        let mut reg = Registry::new(2);
        let s1 = reg.build(cfg(TWO));
        s1.workers[0].state.mark_down(0, 1000, 1000);
        let s2 = reg.build(cfg(TWO));
        assert!(Arc::ptr_eq(&s1.workers[0].state, &s2.workers[0].state));
        assert_eq!(s1.models[0].members[1].id, s2.models[0].members[1].id);
        assert!(Arc::ptr_eq(&s1.models[0].metrics, &s2.models[0].metrics));
        assert_eq!(s2.generation, 2);
        // Worker b moves to another URL: new slot, clean state.
        let s3 = reg.build(cfg(&TWO.replace("127.0.0.1:2", "127.0.0.1:3")));
        assert_ne!(s3.workers[1].state.slot, s1.workers[1].state.slot);
        assert_ne!(s3.models[0].members[1].id, s1.models[0].members[1].id);
        assert!(s3.model(b"m").is_some() && s3.model(b"x").is_none());
    }

    #[test]
    fn down_backoff_doubles_and_caps() {
        let w = WorkerState::new(0, "w", 1);
        assert_eq!(w.mark_down(100, 1000, 5000), 1000);
        assert!(w.is_down(1099) && !w.is_down(1100));
        assert_eq!(w.mark_down(100, 1000, 5000), 2000);
        assert_eq!(w.mark_down(100, 1000, 5000), 4000);
        assert_eq!(w.mark_down(100, 1000, 5000), 5000);
        w.mark_up();
        assert!(!w.is_down(100));
        assert_eq!(w.mark_down(100, 1000, 5000), 1000);
    }
}
