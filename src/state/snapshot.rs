//! The runtime snapshot: one immutable value per config generation, shared by every core
//! behind an `ArcSwap` and pinned by each request for its lifetime. Built by the
//! [`super::Registry`].

use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use super::counters::ModelMetrics;
use super::worker::WorkerState;
use crate::admission::{Gate, InFlight, Room};
use crate::config::{Config, Handoff, PoolRole, WaitingRoom, WorkerConfig};
use crate::http::canned::{Canned, messages};
use crate::route::cache::PredictedCache;
use crate::route::{KvSettings, RouterMode};
use crate::shed::Class;

/// Immutable runtime view of one config generation.
#[derive(Debug)]
pub struct Snapshot {
    pub generation: u64,
    pub config: Config,
    pub models: Box<[Model]>,
    /// Name indexes, built once per generation and only read after: a multiply hash
    /// (the keys come from the config, so the table's chains do too, whatever a client
    /// asks for).
    pub(super) model_index: FxHashMap<Box<[u8]>, usize>,
    pub(super) worker_index: FxHashMap<Box<str>, usize>,
    /// Same order as `config.workers`.
    pub workers: Box<[Worker]>,
    pub responses: Responses,
}

impl Snapshot {
    /// Looks a worker up by its configured name (load events, direct routing).
    pub fn worker_named(&self, name: &str) -> Option<&Worker> {
        self.worker_position(name).map(|i| &self.workers[i])
    }

    /// The position in `workers` of the worker with this configured name.
    pub fn worker_position(&self, name: &str) -> Option<usize> {
        self.worker_index.get(name).copied()
    }

    /// Looks a model up by its decoded name.
    #[inline]
    pub fn model(&self, name: &[u8]) -> Option<&Model> {
        self.model_index.get(name).map(|&i| &self.models[i])
    }

    /// A disaggregated model's prefill pool.
    #[inline]
    pub fn prefill_pool(&self, d: &Disaggregated) -> Option<&Model> {
        self.models.get(d.prefill as usize)
    }
}

#[derive(Debug)]
pub struct Model {
    pub name: Box<str>,
    /// Stable across reloads while the model exists.
    pub id: u32,
    /// The class of its requests that name none.
    pub class: Class,
    pub router_mode: RouterMode,
    pub track_output_blocks: bool,
    pub members: Box<[Member]>,
    pub metrics: Arc<ModelMetrics>,
    /// `kv` mode's settings and predicted-cache index (`None` in other modes).
    pub kv: Option<Arc<KvRouting>>,
    /// Its health checks' interval and timeout, when it has checks: a wait for a head
    /// the interval long makes a silent worker suspect, and a suspicion no check clears
    /// within the timeout ends the waits on it.
    pub stall_check_ms: Option<(u64, u64)>,
    /// Its waiting room and how long requests may wait there (docs/behaviour.md §8.12).
    pub room: Option<ModelRoom>,
    /// Its requests in flight per tenant, when the busy rule spares light tenants
    /// (docs/behaviour.md §8.13).
    pub tenants: Option<Arc<InFlight>>,
    /// A prefill pool (clients cannot name it), or a model clients name.
    pub role: PoolRole,
    /// Its prefill side, when its requests are disaggregated (docs/behaviour.md §23).
    pub disagg: Option<Disaggregated>,
}

/// A disaggregated model's prefill side, resolved for this generation.
#[derive(Debug, Clone, Copy)]
pub struct Disaggregated {
    /// The prefill pool: its index in [`Snapshot::models`].
    pub prefill: u32,
    pub handoff: Handoff,
    pub max_local_prefill_tokens: u64,
}

/// A model's waiting room, shared by every core and kept across reloads that keep its
/// size, with the waits the model allows there.
#[derive(Debug)]
pub struct ModelRoom {
    pub room: Arc<Room>,
    pub settings: WaitingRoom,
}

/// A `kv` model's routing state, kept across reloads while its members, their capacities
/// and the settings that shape the index stay the same.
#[derive(Debug)]
pub struct KvRouting {
    pub settings: KvSettings,
    pub cache: Arc<PredictedCache>,
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
    /// The worker's address and its metrics endpoint's, resolved for this generation.
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub state: Arc<WorkerState>,
    /// Engine slots and overflow queue, when `engine_request_limit` is set.
    pub gate: Option<Arc<Gate>>,
    /// The waiting rooms of the models it serves: a slot it gives back notifies each.
    pub rooms: Box<[Arc<Room>]>,
}

/// The answers the data path gives itself that never change within a generation,
/// rendered once. (Refusals name their knob and figures, so they are rendered each time.)
#[derive(Debug)]
pub struct Responses {
    pub models: Canned,
    pub model_not_found: Canned,
    pub not_found: Canned,
    pub too_many_connections: Canned,
}

impl Responses {
    pub(super) fn new(config: &Config, created: u64) -> Responses {
        let retry = config.retry_after_secs.to_string();
        let retry = [("retry-after", retry.as_str())];
        let data: Vec<_> = config
            .models
            .iter()
            .filter(|m| m.role == PoolRole::Serve)
            .map(|m| serde_json::json!({"id": m.name, "object": "model", "created": created, "owned_by": "spillway"}))
            .collect();
        let models = serde_json::json!({"object": "list", "data": data}).to_string();
        Responses {
            models: Canned::json(200, models.into_bytes(), &[]),
            model_not_found: Canned::error(404, messages::MODEL_NOT_FOUND, &[]),
            not_found: Canned::error(404, messages::NOT_FOUND, &[]),
            too_many_connections: Canned::error(503, messages::TOO_MANY_CONNECTIONS, &retry),
        }
    }
}
