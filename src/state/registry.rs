//! The [`Registry`] builds one [`Snapshot`] per config generation and carries what must
//! outlive a generation: stable ids (worker slots, model ids, member ids), per-worker
//! shared state, admission gates and per-model counters. So a reload keeps the pools, load,
//! busy state and counters of unchanged workers, and a replica of either generation can be
//! read with either snapshot.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::counters::ModelMetrics;
use super::snapshot::{
    Disaggregated, KvRouting, Member, Model, ModelRoom, Responses, Snapshot, Worker,
};
use super::worker::WorkerState;
use crate::admission::{Gate, InFlight, Room, class_slots};
use crate::config::{Addrs, Classes, Config, ModelConfig, WorkerConfig};
use crate::route::cache::PredictedCache;
use crate::route::{KvSettings, RouterMode};
use crate::shed::Class;

/// A worker's identity across generations: its name and URL.
type WorkerKey = (String, String);

/// KV capacity (blocks) assumed for a worker whose `kv_total_blocks` is not configured:
/// bounds what `kv` routing predicts it holds.
pub const DEFAULT_PREDICTED_KV_BLOCKS: u64 = 16_384;

/// What a `kv` model's index depends on: its members in order with their capacities, the
/// block size and the TTL.
type KvKey = (Vec<(WorkerKey, u64)>, u32, u64);

/// Builds snapshots and remembers stable ids and shared state between them.
#[derive(Debug)]
pub struct Registry {
    cores: usize,
    generation: u64,
    created: u64,
    next_slot: u32,
    workers: HashMap<WorkerKey, Arc<WorkerState>>,
    gates: HashMap<WorkerKey, (u32, u32, [u32; 3], Arc<Gate>)>,
    model_ids: HashMap<String, u32>,
    model_metrics: HashMap<String, Arc<ModelMetrics>>,
    member_ids: HashMap<(String, String), u32>,
    kv: HashMap<String, (KvKey, Arc<KvRouting>)>,
    rooms: HashMap<String, Arc<Room>>,
    /// Each model's requests in flight per tenant, while the busy rule spares light
    /// tenants.
    tenants: HashMap<String, Arc<InFlight>>,
}

impl Registry {
    /// A registry for `cores` data cores; `created` (Unix seconds) dates the models in
    /// `/v1/models`.
    pub fn new(cores: usize, created: u64) -> Registry {
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
            kv: HashMap::new(),
            rooms: HashMap::new(),
            tenants: HashMap::new(),
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

    /// The next generation: `config` with the socket addresses resolved for it.
    pub fn build(&mut self, config: Config, addrs: &Addrs) -> Snapshot {
        self.generation += 1;
        let mut workers: Box<[Worker]> = config
            .workers
            .iter()
            .zip(&addrs.workers)
            .map(|(w, a)| Worker {
                cfg: w.clone(),
                addr: a.addr,
                metrics_addr: a.metrics,
                state: self.worker_state(w),
                gate: self.gate(w, &config.classes),
                rooms: Box::default(),
            })
            .collect();
        let models: Box<[Model]> = config
            .models
            .iter()
            .map(|m| self.model(m, &config))
            .collect();
        for (i, w) in workers.iter_mut().enumerate() {
            w.rooms = (models.iter())
                .filter(|m| m.members.iter().any(|p| p.worker as usize == i))
                .filter_map(|m| m.room.as_ref().map(|r| r.room.clone()))
                .collect();
        }
        self.forget_removed(&config);
        Snapshot {
            generation: self.generation,
            model_index: models
                .iter()
                .enumerate()
                .map(|(i, m)| (Box::<[u8]>::from(m.name.as_bytes()), i))
                .collect(),
            worker_index: workers
                .iter()
                .enumerate()
                .map(|(i, w)| (Box::<str>::from(w.cfg.name.as_str()), i))
                .collect(),
            responses: Responses::new(&config, self.created),
            config,
            models,
            workers,
        }
    }

    fn worker_state(&mut self, w: &WorkerConfig) -> Arc<WorkerState> {
        let key = (w.name.clone(), w.url.clone());
        if let Some(s) = self.workers.get(&key) {
            return s.clone();
        }
        let s = Arc::new(WorkerState::new(self.next_slot, &w.name, self.cores));
        self.next_slot += 1;
        self.workers.insert(key, s.clone());
        s
    }

    /// A gate survives a reload while its limits do (N, Q and each class's slots); new
    /// limits start a new gate (requests admitted by the old one finish under it).
    fn gate(&mut self, w: &WorkerConfig, classes: &Classes) -> Option<Arc<Gate>> {
        let key = (w.name.clone(), w.url.clone());
        let Some(n) = w.engine_request_limit else {
            self.gates.remove(&key);
            return None;
        };
        let q = w.request_queue_limit;
        let shares = Class::ALL.map(|c| class_slots(n, classes.get(c).slot_share));
        match self.gates.get(&key) {
            Some((gn, gq, gs, g)) if (*gn, *gq, *gs) == (n, q, shares) => Some(g.clone()),
            _ => {
                let g = Arc::new(Gate::with_class_limits(n, q, shares));
                self.gates.insert(key, (n, q, shares, g.clone()));
                Some(g)
            }
        }
    }

    /// Forgets workers no longer configured, so a re-added one starts clean.
    fn forget_removed(&mut self, config: &Config) {
        let live: HashSet<WorkerKey> = config
            .workers
            .iter()
            .map(|w| (w.name.clone(), w.url.clone()))
            .collect();
        self.workers.retain(|k, _| live.contains(k));
        self.gates.retain(|k, _| live.contains(k));
        self.kv
            .retain(|name, _| config.models.iter().any(|m| m.name == *name));
        (self.tenants).retain(|name, _| config.models.iter().any(|m| m.name == *name));
        self.rooms.retain(|name, _| {
            (config.models.iter()).any(|m| m.name == *name && m.waiting_room.is_some())
        });
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
        let kv = self.kv_routing(m, config);
        Model {
            name: m.name.as_str().into(),
            id,
            class: m.class.unwrap_or(config.classes.default),
            router_mode: m.router_mode,
            track_output_blocks: m.track_output_blocks,
            members,
            metrics,
            kv,
            stall_check_ms: (m.health_check.as_ref()).map(|c| (c.interval_ms, c.timeout_ms)),
            room: self.room(m, config.tenant_room_share),
            tenants: self.tenants(m, config),
            role: m.role,
            disagg: m.disagg.as_ref().and_then(|d| {
                let prefill = config.models.iter().position(|p| p.name == d.prefill)?;
                Some(Disaggregated {
                    prefill: prefill as u32,
                    handoff: d.handoff,
                    max_local_prefill_tokens: d.max_local_prefill_tokens,
                })
            }),
        }
    }

    /// A model's tenants in flight, kept across reloads (each request uncounts itself
    /// from the table it counted itself in), while the busy rule spares light tenants.
    fn tenants(&mut self, m: &ModelConfig, config: &Config) -> Option<Arc<InFlight>> {
        if !config.busy_spares_light_tenants {
            self.tenants.remove(&m.name);
            return None;
        }
        Some(self.tenants.entry(m.name.clone()).or_default().clone())
    }

    /// A model's room survives a reload that keeps its size (its waiters stay in line);
    /// a new size starts a new room (those waiting in the old one finish there). The
    /// tenants' share is set on each build.
    fn room(&mut self, m: &ModelConfig, tenant_share: f64) -> Option<ModelRoom> {
        let Some(settings) = m.waiting_room else {
            self.rooms.remove(&m.name);
            return None;
        };
        let room = match self.rooms.get(&m.name) {
            Some(r) if r.capacity() == settings.size => r.clone(),
            _ => {
                let r = Arc::new(Room::new(settings.size));
                self.rooms.insert(m.name.clone(), r.clone());
                r
            }
        };
        room.set_tenant_share(tenant_share);
        Some(ModelRoom { room, settings })
    }

    /// A `kv` model's index survives a reload that keeps what shapes it; otherwise it
    /// starts empty (forgotten predictions cost prefills, never errors).
    fn kv_routing(&mut self, m: &ModelConfig, config: &Config) -> Option<Arc<KvRouting>> {
        if m.router_mode != RouterMode::Kv {
            self.kv.remove(&m.name);
            return None;
        }
        let settings: KvSettings = m.kv;
        let members: Vec<(WorkerKey, u64)> = m
            .workers
            .iter()
            .map(|&wi| {
                let w = &config.workers[wi];
                let blocks = w.kv_total_blocks.unwrap_or(DEFAULT_PREDICTED_KV_BLOCKS);
                ((w.name.clone(), w.url.clone()), blocks)
            })
            .collect();
        let ttl_ms = (settings.router_ttl_secs * 1000.0) as u64;
        let key = (members, settings.kv_cache_block_size, ttl_ms);
        let cache = match self.kv.get(&m.name) {
            Some((k, kv)) if *k == key && kv.settings == settings => return Some(kv.clone()),
            // Only the cost's knobs changed: keep the predictions.
            Some((k, kv)) if *k == key => kv.cache.clone(),
            _ => {
                let capacities: Vec<u64> = key.0.iter().map(|(_, c)| *c).collect();
                Arc::new(PredictedCache::new(&capacities, ttl_ms))
            }
        };
        let kv = Arc::new(KvRouting { settings, cache });
        self.kv.insert(m.name.clone(), (key, kv.clone()));
        Some(kv)
    }
}

impl Snapshot {
    /// A first generation for `cores` cores, of a configuration that names only IP
    /// literals, with no registry to carry it on (tests and benches). `None` when a name
    /// would need resolving.
    pub fn standalone(config: Config, cores: usize) -> Option<Snapshot> {
        let addrs = Addrs::literals(&config)?;
        Some(Registry::new(cores, 0).build(config, &addrs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    fn build(reg: &mut Registry, text: &str) -> Snapshot {
        let config = Config::parse(text, &Overrides::default()).unwrap();
        let addrs = Addrs::literals(&config).unwrap();
        reg.build(config, &addrs)
    }

    const TWO: &str = "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nname = \"a\"\n[[models.workers]]\nurl = \"http://127.0.0.1:2\"\nname = \"b\"\n";

    #[test]
    fn reload_keeps_state_of_unchanged_workers() {
        let mut reg = Registry::new(2, 0);
        let s1 = build(&mut reg, TWO);
        s1.workers[0].state.mark_down(0, 1000, 1000);
        let s2 = build(&mut reg, TWO);
        assert!(Arc::ptr_eq(&s1.workers[0].state, &s2.workers[0].state));
        assert_eq!(s1.models[0].members[1].id, s2.models[0].members[1].id);
        assert!(Arc::ptr_eq(&s1.models[0].metrics, &s2.models[0].metrics));
        assert_eq!(s2.generation, 2);
        // Worker b moves to another URL: new slot, clean state.
        let s3 = build(&mut reg, &TWO.replace("127.0.0.1:2", "127.0.0.1:3"));
        assert_ne!(s3.workers[1].state.slot, s1.workers[1].state.slot);
        assert_ne!(s3.models[0].members[1].id, s1.models[0].members[1].id);
        assert!(s3.model(b"m").is_some() && s3.model(b"x").is_none());
        assert_eq!(s3.workers[1].addr, "127.0.0.1:3".parse().unwrap());
    }
}
