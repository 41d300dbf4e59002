//! The monitor: on the control thread, it owns all load state, evaluates the busy rule and
//! publishes the busy set to every core's replica. [`Monitor`] is that state and its
//! steps; [`Control`] adds the config lifecycle (reload, state dump) and is what admin
//! handlers act on; `tasks` are its timers. `load` and `scrape::parse` are pure.

mod adaptive;
pub mod checks;
mod control;
mod discover;
pub mod evaluate;
mod event;
mod fanout;
mod fleet;
mod generation;
pub mod health;
pub mod load;
mod nudge;
pub mod peers;
mod release;
mod report;
pub mod scrape;
pub mod tasks;

use std::collections::HashMap;
use std::sync::Arc;

pub use adaptive::Adaptivity;
pub use control::{Command, Control, ReloadError, reload};
pub use discover::supervise;
use evaluate::Latches;
pub use fleet::{BUILD_INTERVAL_MS, Fleet, NatsRole, SourceState};
use load::{LoadTable, Timed};
pub use report::{RankReport, WorkerReport};

use crate::shed::Thresholds;
use crate::state::{BusySet, KvLoad, Shared, Snapshot};
use crate::state::{SlotMap, SlotSet};

/// The monitor's state: load from every source, effective thresholds, decode latches, and
/// the last published busy set.
#[derive(Debug)]
pub struct Monitor {
    pub table: LoadTable,
    /// Effective thresholds per model: the config's, then `/busy_threshold` changes.
    pub thresholds: HashMap<String, Thresholds>,
    /// The thresholds the config file gave, to tell on reload whether the file changed them.
    file_thresholds: HashMap<String, Thresholds>,
    latches: Latches,
    /// The adaptive mode's windows and per-member factors.
    pub adaptivity: Adaptivity,
    scratch: BusySet,
    published: Arc<BusySet>,
    pub publishes: u64,
    /// Per member id: when its entry next changes by itself (see [`evaluate::Rule`]).
    recheck: Vec<u64>,
    /// [`evaluate::members_by_slot`] of the snapshot with this generation.
    slot_index: (u64, SlotMap<Vec<(u32, u32)>>),
    /// Positions of the workers with the `tracked` source in the snapshot with this
    /// generation (the tick folds only theirs in).
    tracked: (u64, Vec<usize>),
    /// What peer replicas routed (`[nats] replica_sync`), folded in with the tracked load.
    pub peers: peers::PeerLoads,
    /// Worker health: outlier ejection and check results.
    pub health: health::HealthTable,
    /// How fast each capped worker's slots come back while requests wait.
    release_rates: release::ReleaseRates,
}

fn file_thresholds(snap: &Snapshot) -> HashMap<String, Thresholds> {
    snap.config
        .models
        .iter()
        .map(|m| (m.name.clone(), m.thresholds))
        .collect()
}

impl Monitor {
    pub fn new(snap: &Snapshot) -> Monitor {
        let file = file_thresholds(snap);
        Monitor {
            table: LoadTable::default(),
            thresholds: file.clone(),
            file_thresholds: file,
            latches: Latches::default(),
            adaptivity: Adaptivity::default(),
            scratch: BusySet::default(),
            published: Arc::new(BusySet::default()),
            publishes: 0,
            recheck: Vec::new(),
            slot_index: (0, SlotMap::default()),
            tracked: (0, Vec::new()),
            peers: peers::PeerLoads::default(),
            health: health::HealthTable::default(),
            release_rates: release::ReleaseRates::default(),
        }
    }

    /// Measures how fast each capped worker's slots come back while requests wait, and
    /// publishes it to its gate (waiters' predicted waits).
    pub fn measure_releases(&mut self, snap: &Snapshot, now: u64) {
        self.release_rates.observe(snap, now);
    }

    /// Carries state into a new config generation: thresholds set through the API survive
    /// unless the file changed that model's thresholds; state of removed workers goes.
    pub fn on_reload(&mut self, snap: &Snapshot) {
        let mut thresholds = HashMap::new();
        for m in &snap.config.models {
            let kept = self.thresholds.get(&m.name).copied();
            let unchanged = self.file_thresholds.get(&m.name) == Some(&m.thresholds);
            thresholds.insert(
                m.name.clone(),
                kept.filter(|_| unchanged).unwrap_or(m.thresholds),
            );
        }
        self.thresholds = thresholds;
        self.file_thresholds = file_thresholds(snap);
        self.table.retain(snap);
    }

    /// Carries state into a generation of found workers built off the loop: only the
    /// load of workers that left is forgotten, and the slot index comes with the build.
    pub fn on_members_changed(
        &mut self,
        snap: &Snapshot,
        change: &generation::Change,
        index: SlotMap<Vec<(u32, u32)>>,
    ) {
        if change.full {
            self.on_reload(snap);
        } else {
            for slot in &change.gone_slots {
                self.table.workers.remove(slot);
            }
        }
        self.slot_index = (snap.generation, index);
    }

    /// Publishes a generation's membership change: clears the members that left and
    /// evaluates those that joined or changed (a full pass when `change.full`). Every
    /// other member's entry is the same in either generation. Returns whether it
    /// published.
    pub fn publish_change(
        &mut self,
        shared: &Shared,
        snap: &Snapshot,
        now: u64,
        change: &generation::Change,
    ) -> bool {
        if change.full {
            return self.publish(shared, snap, now);
        }
        self.publish_loads(snap, now);
        for &id in &change.left {
            self.scratch.clear_member(id);
        }
        let rule = evaluate::Rule {
            thresholds: &self.thresholds,
            adaptivity: &self.adaptivity,
            latches: &mut self.latches,
            recheck: &mut self.recheck,
        };
        let members = change.evaluate.iter().copied();
        let changed =
            evaluate::evaluate_members(snap, &self.table, rule, now, &mut self.scratch, members);
        if !changed && (change.left.is_empty() || self.scratch == *self.published) {
            return false;
        }
        self.store(shared, snap, now);
        true
    }

    pub fn published(&self) -> &BusySet {
        &self.published
    }

    /// Folds what the cores routed and have not finished into the tracked source: sums
    /// over cores plus what live peer replicas routed, spread evenly over the worker's
    /// ranks. Allocates nothing once warm.
    pub fn refresh_tracked(&mut self, snap: &Snapshot, now: u64) {
        let forgotten = self.peers.expire(now);
        if forgotten > 0 {
            tracing::info!(
                forgotten,
                left = self.peers.peers(),
                "peer replicas fell silent"
            );
        }
        if self.tracked.0 != snap.generation {
            let at = snap.workers.iter().enumerate();
            let tracked = at.filter(|(_, w)| w.cfg.load_sources.tracked);
            self.tracked = (snap.generation, tracked.map(|(i, _)| i).collect());
        }
        for w in self.tracked.1.iter().filter_map(|&i| snap.workers.get(i)) {
            let (here, peers) = (w.state.routed_totals(), self.peers.of(w.state.slot));
            let prefill = here.prefill_tokens.wrapping_add(peers.prefill_tokens);
            let blocks = here.decode_blocks.wrapping_add(peers.decode_blocks);
            let load = self.table.worker(w.state.slot);
            let ranks = load.dp_size(&w.cfg) as u64;
            for r in 0..ranks as usize {
                let rank = load.rank_mut(r);
                rank.tracked.active_prefill_tokens = Some(Timed {
                    value: prefill.div_ceil(ranks),
                    at: now,
                });
                rank.tracked.active_decode_blocks = Some(Timed {
                    value: blocks.div_ceil(ranks),
                    at: now,
                });
            }
        }
    }

    /// Re-evaluates the busy rule and, when the set changed, publishes it to every core's
    /// replica before returning. Returns whether it published.
    pub fn publish(&mut self, shared: &Shared, snap: &Snapshot, now: u64) -> bool {
        self.publish_loads(snap, now);
        let rule = evaluate::Rule {
            thresholds: &self.thresholds,
            adaptivity: &self.adaptivity,
            latches: &mut self.latches,
            recheck: &mut self.recheck,
        };
        evaluate::evaluate(snap, &self.table, rule, now, &mut self.scratch);
        if self.scratch == *self.published {
            return false;
        }
        self.store(shared, snap, now);
        true
    }

    /// The periodic pass: evaluates again only the members whose entry may have changed
    /// by itself ([`evaluate::evaluate_due`]) and publishes when one did; nudges the
    /// waiting rooms either way. Returns whether it published.
    pub fn publish_due(&mut self, shared: &Shared, snap: &Snapshot, now: u64) -> bool {
        self.publish_loads(snap, now);
        let health = self.health.pass(snap, now, &mut self.scratch);
        let rule = evaluate::Rule {
            thresholds: &self.thresholds,
            adaptivity: &self.adaptivity,
            latches: &mut self.latches,
            recheck: &mut self.recheck,
        };
        if !evaluate::evaluate_due(snap, &self.table, rule, now, &mut self.scratch) && !health {
            // Holds and backoffs end by the clock: the rooms are nudged on each tick.
            nudge::nudge(snap, &self.published, now);
            return false;
        }
        self.store(shared, snap, now);
        true
    }

    /// Evaluates again only the workers in `slots` (their load just arrived) and, when
    /// their entries changed, publishes at once. Between full passes the set keeps the
    /// last full evaluation for everyone else. Returns whether it published.
    pub fn publish_slots(
        &mut self,
        shared: &Shared,
        snap: &Snapshot,
        now: u64,
        slots: &SlotSet,
    ) -> bool {
        if self.slot_index.0 != snap.generation {
            self.slot_index = (snap.generation, evaluate::members_by_slot(snap));
        }
        let rule = evaluate::Rule {
            thresholds: &self.thresholds,
            adaptivity: &self.adaptivity,
            latches: &mut self.latches,
            recheck: &mut self.recheck,
        };
        let index = &self.slot_index.1;
        if !evaluate::evaluate_slots(
            snap,
            &self.table,
            rule,
            now,
            &mut self.scratch,
            slots,
            index,
        ) {
            return false;
        }
        self.store(shared, snap, now);
        true
    }

    /// Publishes the health bits alone, when a check changed a worker's health. Returns
    /// whether it published.
    pub fn publish_health(&mut self, shared: &Shared, snap: &Snapshot, now: u64) -> bool {
        if !self.health.pass(snap, now, &mut self.scratch) {
            return false;
        }
        self.store(shared, snap, now);
        true
    }

    /// Publishes `scratch` as the next generation to every core's replica, then nudges
    /// the waiting rooms by it (`nudge.rs`).
    fn store(&mut self, shared: &Shared, snap: &Snapshot, now: u64) {
        let mut next = self.scratch.clone();
        next.generation = self.published.generation + 1;
        let next = Arc::new(next);
        for replica in shared.busy.iter() {
            replica.store(next.clone());
        }
        self.published = next;
        self.publishes += 1;
        nudge::nudge(snap, &self.published, now);
    }

    /// Stores in each worker's shared state, where `kv` routing reads it, the load its
    /// engine reported (summed over ranks) and the router's tracked load as folded now
    /// (see [`crate::state::worker::WorkerState::kv_load`]): atomics, so a load that
    /// changes every interval costs no publication.
    fn publish_loads(&self, snap: &Snapshot, now: u64) {
        // Only `kv` routing reads it.
        if snap.models.iter().all(|m| m.kv.is_none()) {
            return;
        }
        let staleness = snap.config.load_staleness_ms;
        for w in snap.workers.iter() {
            let mut engine = KvLoad::default();
            if let Some(load) = self.table.workers.get(&w.state.slot) {
                for r in 0..load.dp_size(&w.cfg) {
                    let (prefill, decode) = load.reported(r, &w.cfg, now, staleness);
                    engine.prefill_tokens += prefill;
                    engine.decode_blocks += decode;
                }
            }
            w.state.publish_load(engine, self.peers.of(w.state.slot));
        }
    }

    /// Busy members of a model in the published set (for the model's default class).
    pub fn busy_workers(&self, snap: &Snapshot, model: &str) -> usize {
        snap.models
            .iter()
            .filter(|m| &*m.name == model)
            .flat_map(|m| m.members.iter().map(|mm| (m.class, mm)))
            .filter(|&(class, mm)| self.published.is_busy(class, mm.id))
            .count()
    }

    /// Stores one scrape's result for a worker (missing metrics become unknown, and are
    /// warned about once each) and the engine's slots when the scrape learnt them.
    pub fn apply_scrape(
        &mut self,
        snap: &Snapshot,
        slot: u32,
        (result, total_slots): (Result<String, String>, Option<u64>),
        now: u64,
    ) {
        let Some(w) = snap.workers.iter().find(|w| w.state.slot == slot) else {
            return;
        };
        let load = self.table.worker(slot);
        let text = match result {
            Ok(text) => text,
            Err(e) => {
                if load.scrape_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(worker = %w.cfg.name, error = %e, "scrape failed");
                }
                load.scrape_error = Some(e);
                return;
            }
        };
        let scraped = scrape::parse(w.cfg.metrics_format, &text, &w.cfg);
        w.state.load_reported(now);
        load.last_scrape = Some(now);
        load.scrape_error = None;
        if total_slots.is_some() {
            load.total_slots = total_slots;
        }
        for metric in (scraped.missing.iter()).filter(|m| !load.scrape_missing.contains(m)) {
            tracing::warn!(
                worker = %w.cfg.name,
                metric,
                format = ?w.cfg.metrics_format,
                "the engine does not export a metric this format reads; its signal stays unknown"
            );
        }
        load.scrape_missing = scraped.missing;
        let timed = |v: Option<u64>| v.map(|value| Timed { value, at: now });
        for (i, r) in scraped.ranks.iter().enumerate() {
            let rank = load.rank_mut(i);
            rank.scrape.kv_used_blocks = timed(r.kv_used_blocks);
            rank.scrape.waiting_requests = timed(r.waiting);
            rank.scrape.active_decode_blocks = None;
            rank.scrape.active_prefill_tokens = None;
            if r.kv_total_blocks.is_some() {
                rank.kv_total_blocks = r.kv_total_blocks;
            }
            rank.running = r.running;
        }
    }

    /// Spillway's own requests beyond each engine's slots, where the slots are known:
    /// requests at the engine (in flight, less those waiting at its gate) over its slots
    /// wait in its queue. Spread evenly over the worker's ranks; a fact of Spillway's own
    /// routing, so it counts whatever the worker's load sources.
    pub fn refresh_beyond_slots(&mut self, snap: &Snapshot) {
        for w in snap.workers.iter() {
            let reported = self.table.workers.get(&w.state.slot);
            if reported
                .and_then(|l| l.total_slots)
                .or(w.cfg.total_slots)
                .is_none()
            {
                continue;
            }
            let queued = w.gate.as_ref().map_or(0, |g| g.occupancy().1);
            let at_engine = w.state.inflight_total().saturating_sub(queued);
            self.table
                .worker(w.state.slot)
                .count_at_engine(at_engine, &w.cfg);
        }
    }
}
