//! What the monitor believes about each worker: `GET /load` serves it as JSON, SIGUSR1
//! logs it.

use super::Monitor;
use super::load::WorkerLoad;
use crate::config::LoadSources;
use crate::shed::RankLoad;
use crate::state::{Snapshot, Worker};

#[derive(Debug, serde::Serialize)]
pub struct WorkerReport {
    pub worker_id: String,
    pub url: String,
    pub down: bool,
    /// Models in whose published busy set the worker is.
    pub busy_in: Vec<String>,
    pub inflight: u64,
    pub slots_in_use: u64,
    /// `engine_request_limit`, when set.
    pub slots: Option<u32>,
    pub queued: u64,
    pub sources: LoadSources,
    pub last_push_age_ms: Option<u64>,
    pub last_scrape_age_ms: Option<u64>,
    pub scrape_error: Option<String>,
    pub ranks: Vec<RankReport>,
}

#[derive(Debug, serde::Serialize)]
pub struct RankReport {
    pub dp_rank: usize,
    #[serde(flatten)]
    pub load: RankLoad,
    /// The requests the engine runs, as its last scrape said (informational).
    pub running_requests: Option<u64>,
}

impl Monitor {
    /// One report per configured worker, effective loads as the busy rule sees them now.
    pub fn report(&self, snap: &Snapshot, now: u64) -> Vec<WorkerReport> {
        // Each worker's busy models, from one pass over the members (not one per worker:
        // a front door has thousands).
        let published = self.published();
        let mut busy_in: Vec<Vec<String>> = vec![Vec::new(); snap.workers.len()];
        for m in snap.models.iter() {
            for mm in m
                .members
                .iter()
                .filter(|mm| published.is_busy(m.class, mm.id))
            {
                let Some(models) = busy_in.get_mut(mm.worker as usize) else {
                    continue;
                };
                if models.last().is_none_or(|last| **last != *m.name) {
                    models.push(m.name.to_string());
                }
            }
        }
        snap.workers
            .iter()
            .zip(busy_in)
            .map(|(w, busy_in)| self.report_one(snap, w, busy_in, now))
            .collect()
    }

    fn report_one(
        &self,
        snap: &Snapshot,
        w: &Worker,
        busy_in: Vec<String>,
        now: u64,
    ) -> WorkerReport {
        let empty = WorkerLoad::default();
        let load = self.table.workers.get(&w.state.slot).unwrap_or(&empty);
        let (slots_in_use, queued) = w.gate.as_ref().map_or((0, 0), |g| g.occupancy());
        let staleness = snap.config.load_staleness_ms;
        WorkerReport {
            worker_id: w.cfg.name.clone(),
            url: w.cfg.url.clone(),
            down: w.state.is_down(now),
            busy_in,
            inflight: w.state.inflight_total(),
            slots_in_use,
            slots: w.gate.as_ref().map(|g| g.limit()),
            queued,
            sources: w.cfg.load_sources,
            last_push_age_ms: load.last_push.map(|t| now.saturating_sub(t)),
            last_scrape_age_ms: load.last_scrape.map(|t| now.saturating_sub(t)),
            scrape_error: load.scrape_error.clone(),
            ranks: (0..load.dp_size(&w.cfg))
                .map(|r| RankReport {
                    dp_rank: r,
                    load: load.effective(r, &w.cfg, now, staleness),
                    running_requests: load.ranks.get(r).and_then(|rank| rank.running),
                })
                .collect(),
        }
    }
}

impl WorkerReport {
    /// One log line for the worker, one per rank.
    pub fn log(&self) {
        tracing::info!(
            worker = %self.worker_id,
            url = %self.url,
            down = self.down,
            busy_in = ?self.busy_in,
            inflight = self.inflight,
            slots_in_use = self.slots_in_use,
            slots = ?self.slots,
            queued = self.queued,
            push = self.sources.push,
            scrape = self.sources.scrape,
            tracked = self.sources.tracked,
            push_age_ms = ?self.last_push_age_ms,
            scrape_age_ms = ?self.last_scrape_age_ms,
            scrape_error = ?self.scrape_error,
            "worker"
        );
        for r in &self.ranks {
            tracing::info!(
                worker = %self.worker_id,
                rank = r.dp_rank,
                active_decode_blocks = ?r.load.active_decode_blocks,
                kv_used_blocks = ?r.load.kv_used_blocks,
                active_prefill_tokens = ?r.load.active_prefill_tokens,
                kv_total_blocks = ?r.load.kv_total_blocks,
                max_num_batched_tokens = ?r.load.max_num_batched_tokens,
                "rank"
            );
        }
    }
}
