//! Load state per worker and rank, from every source (docs/behaviour.md §2), and the evaluation
//! of the busy set. Pure: no I/O, `now` is an argument; the monitor thread drives it.

use crate::config::WorkerConfig;
use crate::http::limits::MAX_DP_SIZE;
use crate::shed::RankLoad;
use crate::state::Snapshot;
use crate::state::{SlotMap, SlotSet};

pub use super::event::{LoadEvent, PushError, WorkerRef, parse_events};

/// A value and when it was observed (monotonic ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timed {
    pub value: u64,
    pub at: u64,
}

/// One source's view of a rank's load signals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    pub active_decode_blocks: Option<Timed>,
    pub kv_used_blocks: Option<Timed>,
    pub active_prefill_tokens: Option<Timed>,
    /// Requests waiting in the engine's own queue.
    pub waiting_requests: Option<Timed>,
}

impl Signals {
    fn fresh(t: Option<Timed>, now: u64, staleness: u64) -> Option<u64> {
        t.filter(|t| now.saturating_sub(t.at) < staleness)
            .map(|t| t.value)
    }
}

#[derive(Debug, Clone, Default)]
pub struct RankState {
    pub push: Signals,
    pub scrape: Signals,
    pub tracked: Signals,
    /// Capacity reported at runtime (load events, scrapes); overrides config.
    pub kv_total_blocks: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    /// Requests the engine runs, from scrapes (informational).
    pub running: Option<u64>,
    /// Spillway's own requests beyond the engine's slots, as the last tick counted them
    /// (known only where the slots are).
    pub beyond_slots: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct WorkerLoad {
    pub ranks: Vec<RankState>,
    /// dp_size reported at runtime; overrides config.
    pub dp_size: Option<u32>,
    /// The engine's slots (requests it runs at once) reported at runtime (llama.cpp's
    /// `/props`, a pushed `request_total_slots`); overrides config.
    pub total_slots: Option<u64>,
    /// The metrics the last scrape expected and did not find (warned once each).
    pub scrape_missing: Vec<&'static str>,
    /// When the last push or scrape arrived (SIGUSR1 dump, metrics).
    pub last_push: Option<u64>,
    pub last_scrape: Option<u64>,
    pub scrape_error: Option<String>,
}

pub(super) fn max_opt(values: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    values.into_iter().flatten().max()
}

impl WorkerLoad {
    pub fn dp_size(&self, cfg: &WorkerConfig) -> usize {
        self.dp_size.unwrap_or(cfg.dp_size).max(1) as usize
    }

    /// The router's tracked prefill tokens on a rank (0 when none are known).
    pub fn tracked_prefill(&self, rank: usize) -> u64 {
        let tracked = self
            .ranks
            .get(rank)
            .and_then(|r| r.tracked.active_prefill_tokens);
        tracked.map_or(0, |t| t.value)
    }

    /// The engine's slots: as reported, else as configured.
    pub fn total_slots(&self, cfg: &WorkerConfig) -> Option<u64> {
        self.total_slots.or(cfg.total_slots)
    }

    /// Counts Spillway's `at_engine` requests (in flight, not waiting at its gate) against
    /// the engine's slots: those beyond wait in its queue, spread evenly over its ranks.
    /// Nothing is counted while the slots are unknown.
    pub fn count_at_engine(&mut self, at_engine: u64, cfg: &WorkerConfig) {
        let Some(slots) = self.total_slots(cfg) else {
            return;
        };
        let ranks = self.dp_size(cfg) as u64;
        let beyond = at_engine.saturating_sub(slots).div_ceil(ranks);
        for r in 0..ranks as usize {
            self.rank_mut(r).beyond_slots = Some(beyond);
        }
    }

    pub fn rank_mut(&mut self, rank: usize) -> &mut RankState {
        if self.ranks.len() <= rank {
            self.ranks.resize_with(rank + 1, RankState::default);
        }
        &mut self.ranks[rank]
    }

    /// Effective load of one rank: per signal the maximum over fresh sources the worker
    /// uses; capacity from the latest report, else the config.
    pub fn effective(&self, rank: usize, cfg: &WorkerConfig, now: u64, staleness: u64) -> RankLoad {
        self.effective_until(rank, cfg, now, staleness).0
    }

    /// [`WorkerLoad::effective`], and when it changes by itself: the first instant one of
    /// its fresh pushed or scraped signals turns stale (`u64::MAX`: none will). One pass
    /// over the rank's signals (the monitor's busiest loop).
    pub fn effective_until(
        &self,
        rank: usize,
        cfg: &WorkerConfig,
        now: u64,
        staleness: u64,
    ) -> (RankLoad, u64) {
        let Some(r) = self.ranks.get(rank) else {
            let load = RankLoad {
                kv_total_blocks: cfg.kv_total_blocks,
                max_num_batched_tokens: cfg.max_num_batched_tokens,
                ..RankLoad::default()
            };
            return (load, u64::MAX);
        };
        let mut until = u64::MAX;
        let mut fresh = |t: Option<Timed>| {
            let t = t.filter(|t| now.saturating_sub(t.at) < staleness)?;
            until = until.min(t.at.saturating_add(staleness));
            Some(t.value)
        };
        let src = cfg.load_sources;
        let (scrape, tracked) = (
            src.scrape.then_some(&r.scrape),
            src.tracked.then_some(&r.tracked),
        );
        let load = RankLoad {
            active_decode_blocks: max_opt([
                fresh(r.push.active_decode_blocks),
                scrape.and_then(|s| fresh(s.active_decode_blocks)),
                tracked
                    .and_then(|s| s.active_decode_blocks)
                    .map(|t| t.value),
            ]),
            kv_used_blocks: max_opt([
                fresh(r.push.kv_used_blocks),
                scrape.and_then(|s| fresh(s.kv_used_blocks)),
            ]),
            active_prefill_tokens: max_opt([
                fresh(r.push.active_prefill_tokens),
                scrape.and_then(|s| fresh(s.active_prefill_tokens)),
                tracked
                    .and_then(|s| s.active_prefill_tokens)
                    .map(|t| t.value),
            ]),
            kv_total_blocks: r.kv_total_blocks.or(cfg.kv_total_blocks),
            max_num_batched_tokens: r.max_num_batched_tokens.or(cfg.max_num_batched_tokens),
            waiting_requests: max_opt([
                fresh(r.push.waiting_requests),
                scrape.and_then(|s| fresh(s.waiting_requests)),
                r.beyond_slots,
            ]),
        };
        (load, until)
    }

    /// What the engine itself reported for a rank (fresh push or scrape, without the
    /// router's tracked load): (active prefill tokens, active decode blocks).
    pub fn reported(
        &self,
        rank: usize,
        cfg: &WorkerConfig,
        now: u64,
        staleness: u64,
    ) -> (u64, u64) {
        let Some(r) = self.ranks.get(rank) else {
            return (0, 0);
        };
        let fresh = |t| Signals::fresh(t, now, staleness);
        let scrape = |t| {
            if cfg.load_sources.scrape {
                fresh(t)
            } else {
                None
            }
        };
        let prefill = max_opt([
            fresh(r.push.active_prefill_tokens),
            scrape(r.scrape.active_prefill_tokens),
        ]);
        let decode = max_opt([
            fresh(r.push.active_decode_blocks),
            scrape(r.scrape.active_decode_blocks),
        ]);
        (prefill.unwrap_or(0), decode.unwrap_or(0))
    }
}

/// Every load-related fact the monitor holds, by worker slot.
#[derive(Debug, Default)]
pub struct LoadTable {
    pub workers: SlotMap<WorkerLoad>,
    /// `push_where`'s per-event workers, kept for their storage.
    found: Vec<Option<usize>>,
}

impl LoadTable {
    pub fn worker(&mut self, slot: u32) -> &mut WorkerLoad {
        self.workers.entry(slot).or_default()
    }

    /// Applies a batch of pushed events: all are checked first, then all applied.
    pub fn push(
        &mut self,
        snap: &Snapshot,
        events: &[LoadEvent],
        now: u64,
    ) -> Result<usize, PushError> {
        self.push_where(snap, events, now, None)
            .map(|(applied, _)| applied)
    }

    /// Applies the events for workers `snap` has and skips the others (one subject
    /// carries a whole fleet's load): (applied, skipped). An invalid event for a known
    /// worker refuses the whole batch, as `push` does. The slots of the workers that got
    /// events are added to `touched`.
    pub fn push_known(
        &mut self,
        snap: &Snapshot,
        events: &[LoadEvent],
        now: u64,
        touched: &mut SlotSet,
    ) -> Result<(usize, usize), PushError> {
        self.push_where(snap, events, now, Some(touched))
    }

    /// Checks every event, then applies them. A worker (and its load entry) is looked
    /// up once per run of its events (a message usually carries all of one worker's
    /// ranks), and each run is applied to its worker's entry in one go; the report ends
    /// the worker's refusal hold ([`crate::state::WorkerState::load_reported`]). Without
    /// `touched`, an unknown worker refuses the batch; with it, its events are skipped.
    fn push_where(
        &mut self,
        snap: &Snapshot,
        events: &[LoadEvent],
        now: u64,
        mut touched: Option<&mut SlotSet>,
    ) -> Result<(usize, usize), PushError> {
        // Each event's worker, by position in `snap.workers` (None: unknown), in storage
        // kept between batches.
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        let checked = self.check_all(snap, events, touched.is_none(), &mut found);
        let result = checked.map(|skipped| {
            let mut at = 0;
            for run in found.chunk_by(|a, b| a == b) {
                let (first, n) = (at, run.len());
                at += n;
                let Some(worker) = run[0].and_then(|i| snap.workers.get(i)) else {
                    continue;
                };
                let slot = worker.state.slot;
                if let Some(t) = touched.as_deref_mut() {
                    t.insert(slot);
                }
                let w = self.worker(slot);
                for e in &events[first..first + n] {
                    apply(w, e, now);
                }
                worker.state.load_reported(now);
            }
            (events.len() - skipped, skipped)
        });
        self.found = found;
        result
    }

    /// Resolves and checks every event, pushing each one's worker (its position in
    /// `snap.workers`; None: not a worker of `snap`) to `found`; returns how many were
    /// skipped. With `strict`, unknown workers are an error naming them all.
    fn check_all(
        &self,
        snap: &Snapshot,
        events: &[LoadEvent],
        strict: bool,
        found: &mut Vec<Option<usize>>,
    ) -> Result<usize, PushError> {
        let (mut unknown, mut skipped) = (Vec::new(), 0);
        // The current run's worker id, the worker's position, and its current dp_size.
        type Target<'s> = Option<(usize, &'s crate::state::Worker, u32)>;
        let mut run: Option<(&WorkerRef, Target<'_>)> = None;
        for e in events {
            let target = match run {
                Some((id, target)) if *id == e.worker_id => target,
                _ => {
                    let at = e.worker_id.with_name(|name| snap.worker_position(name));
                    at.and_then(|i| Some((i, snap.workers.get(i)?)))
                        .map(|(i, w)| {
                            let load = self.workers.get(&w.state.slot);
                            (
                                i,
                                w,
                                load.map_or(w.cfg.dp_size, |l| l.dp_size(&w.cfg) as u32),
                            )
                        })
                }
            };
            run = Some((&e.worker_id, target));
            let Some((i, w, dp)) = target else {
                if strict {
                    unknown.push(e.worker_id.name());
                }
                skipped += 1;
                found.push(None);
                continue;
            };
            check(e, w, dp)?;
            found.push(Some(i));
        }
        if !unknown.is_empty() {
            return Err(PushError::UnknownWorker(unknown.join(", ")));
        }
        Ok(skipped)
    }

    /// Drops state of workers no longer configured.
    pub fn retain(&mut self, snap: &Snapshot) {
        let live: SlotSet = snap.workers.iter().map(|w| w.state.slot).collect();
        self.workers.retain(|slot, _| live.contains(slot));
    }
}

/// An event's dp_size and dp_rank against the worker's (`dp`: its dp_size before this
/// batch).
fn check(e: &LoadEvent, w: &crate::state::Worker, dp: u32) -> Result<(), PushError> {
    let dp = e.dp_size.unwrap_or(dp);
    // The file's bound: a larger size would size the rank tables (and every
    // evaluation's loop) by a number from the wire.
    if e.dp_size.is_some_and(|d| d == 0 || d > MAX_DP_SIZE) {
        return Err(PushError::Invalid(format!(
            "dp_size must be between 1 and {MAX_DP_SIZE} (worker {})",
            w.cfg.name
        )));
    }
    if e.dp_rank >= dp {
        return Err(PushError::Invalid(format!(
            "dp_rank {} is out of range for worker {} (dp_size {dp})",
            e.dp_rank, w.cfg.name
        )));
    }
    Ok(())
}

/// Applies one checked event to its worker's load.
fn apply(w: &mut WorkerLoad, e: &LoadEvent, now: u64) {
    w.last_push = Some(now);
    if e.dp_size.is_some() {
        w.dp_size = e.dp_size;
    }
    let r = w.rank_mut(e.dp_rank as usize);
    let at = |v: Option<u64>, old: Option<Timed>| v.map(|value| Timed { value, at: now }).or(old);
    r.push.active_decode_blocks = at(e.active_decode_blocks, r.push.active_decode_blocks);
    r.push.kv_used_blocks = at(e.kv_used_blocks, r.push.kv_used_blocks);
    r.push.active_prefill_tokens = at(e.active_prefill_tokens, r.push.active_prefill_tokens);
    r.push.waiting_requests = at(e.num_requests_waiting, r.push.waiting_requests);
    if e.kv_total_blocks.is_some() {
        r.kv_total_blocks = e.kv_total_blocks;
    }
    if e.max_num_batched_tokens.is_some() {
        r.max_num_batched_tokens = e.max_num_batched_tokens;
    }
    if e.request_total_slots.is_some() {
        w.total_slots = e.request_total_slots;
    }
}

#[cfg(test)]
mod tests {
    use super::super::adaptive::Adaptivity;
    use super::super::evaluate::{Latches, Rule, evaluate};
    use super::*;
    use crate::config::{Config, Overrides};
    use crate::shed::{Class, Knob, Thresholds};
    use crate::state::BusySet;
    use std::collections::HashMap;

    fn snap(extra: &str) -> Snapshot {
        let text = format!(
            "load_staleness_ms = 1000\n[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.5\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nname = \"a\"\nkv_total_blocks = 100\n{extra}\n[[models.workers]]\nurl = \"http://127.0.0.1:2\"\nname = \"b\"\n"
        );
        Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), 1).unwrap()
    }

    fn ev(json: &str) -> Vec<LoadEvent<'_>> {
        parse_events(json.as_bytes()).unwrap()
    }

    fn thresholds(s: &Snapshot) -> HashMap<String, Thresholds> {
        s.config
            .models
            .iter()
            .map(|m| (m.name.clone(), m.thresholds))
            .collect()
    }

    fn busy_after(s: &Snapshot, table: &LoadTable, now: u64) -> BusySet {
        let mut out = BusySet::default();
        let rule = Rule {
            thresholds: &thresholds(s),
            adaptivity: &Adaptivity::default(),
            latches: &mut Latches::default(),
            recheck: &mut Vec::new(),
        };
        evaluate(s, table, rule, now, &mut out);
        out
    }

    #[test]
    fn push_makes_busy_and_staleness_ages_out() {
        let s = snap("");
        let mut t = LoadTable::default();
        assert_eq!(
            t.push(
                &s,
                &ev(r#"{"worker_id":"a","active_decode_blocks":60}"#),
                100
            ),
            Ok(1)
        );
        let b = busy_after(&s, &t, 100);
        let member_a = s.models[0].members[0].id;
        assert!(b.enabled(s.models[0].id));
        assert!(b.is_busy(Class::Standard, member_a));
        assert_eq!(b.load(member_a), 600);
        // 1000 ms later the value is stale: unknown, so not busy.
        assert!(!busy_after(&s, &t, 1100).is_busy(Class::Standard, member_a));
    }

    /// The engine's queue as a busy signal: a pushed `num_requests_waiting`, and
    /// Spillway's own requests beyond the engine's slots (configured, or pushed as
    /// `request_total_slots`), over `waiting_requests_threshold`.
    #[test]
    fn waiting_requests_make_busy() {
        let mut s = snap("total_slots = 4");
        let mut t = LoadTable::default();
        let member_a = s.models[0].members[0].id;
        let mut th = thresholds(&s);
        th.insert(
            "m".into(),
            Thresholds {
                waiting_requests_threshold: Some(1),
                ..Default::default()
            },
        );
        let busy = |s: &Snapshot, t: &LoadTable, th: &HashMap<String, Thresholds>| {
            let mut out = BusySet::default();
            let rule = Rule {
                thresholds: th,
                adaptivity: &Adaptivity::default(),
                latches: &mut Latches::default(),
                recheck: &mut Vec::new(),
            };
            evaluate(s, t, rule, 100, &mut out);
            out.why(Class::Standard, member_a)
                .map(|w| (w.knob, w.value, w.threshold))
        };
        let push = r#"{"worker_id":"a","num_requests_waiting":2}"#;
        assert_eq!(t.push(&s, &ev(push), 100), Ok(1));
        assert_eq!(busy(&s, &t, &th), Some((Knob::WaitingRequests, 2.0, 1.0)));
        let push = r#"{"worker_id":"a","num_requests_waiting":1}"#;
        t.push(&s, &ev(push), 100).unwrap();
        assert_eq!(busy(&s, &t, &th), None, "at the threshold is not over it");
        // Six of Spillway's requests at a 4-slot engine: two wait there.
        let cfg = s.workers[0].cfg.clone();
        t.worker(s.workers[0].state.slot).count_at_engine(6, &cfg);
        assert_eq!(busy(&s, &t, &th), Some((Knob::WaitingRequests, 2.0, 1.0)));
        // A reported slot count wins over the file's.
        let push = r#"{"worker_id":"a","request_total_slots":8}"#;
        t.push(&s, &ev(push), 100).unwrap();
        t.worker(s.workers[0].state.slot).count_at_engine(6, &cfg);
        assert_eq!(busy(&s, &t, &th), None);
        // Unknown slots: nothing counted.
        s = snap("");
        let mut t = LoadTable::default();
        let cfg = s.workers[0].cfg.clone();
        t.worker(s.workers[0].state.slot).count_at_engine(100, &cfg);
        assert_eq!(busy(&s, &t, &th), None);
    }

    #[test]
    fn batches_are_all_or_nothing() {
        let s = snap("");
        let mut t = LoadTable::default();
        let err = t.push(
            &s,
            &ev(r#"[{"worker_id":"a","active_decode_blocks":60},{"worker_id":"zzz"}]"#),
            0,
        );
        assert_eq!(err, Err(PushError::UnknownWorker("zzz".into())));
        let err = t.push(
            &s,
            &ev(r#"[{"worker_id":"a","active_decode_blocks":60},{"worker_id":"b","dp_rank":1}]"#),
            0,
        );
        assert!(matches!(err, Err(PushError::Invalid(m)) if m.contains("dp_rank 1")));
        assert!(t.workers.is_empty());
        assert!(parse_events(br#"{"worker_id":"a","bogus":1}"#).is_err());
        assert!(parse_events(br#"{"worker_id":"a","active_decode_blocks":-1}"#).is_err());
        assert!(
            parse_events(br#"  [{"worker_id":"a"},{"worker_id":7}]"#).is_ok_and(|v| v.len() == 2)
        );
    }

    #[test]
    fn dp_worker_is_busy_only_when_every_rank_is() {
        let s = snap("dp_size = 2");
        let mut t = LoadTable::default();
        let member_a = s.models[0].members[0].id;
        t.push(
            &s,
            &ev(r#"{"worker_id":"a","dp_rank":0,"kv_used_blocks":90}"#),
            0,
        )
        .unwrap();
        assert!(!busy_after(&s, &t, 0).is_busy(Class::Standard, member_a));
        t.push(
            &s,
            &ev(r#"{"worker_id":"a","dp_rank":1,"kv_used_blocks":51}"#),
            0,
        )
        .unwrap();
        assert!(busy_after(&s, &t, 0).is_busy(Class::Standard, member_a));
    }

    /// Found by `fuzz/` (target `admin_load`): a pushed `dp_size` was unbounded, so one
    /// event sized a rank table by it (`dp_rank` 3999999999: out of memory) or made every
    /// evaluation loop over that many ranks.
    #[test]
    fn pushed_dp_size_is_bounded_like_the_file() {
        let s = snap("");
        let mut t = LoadTable::default();
        for body in [
            r#"{"worker_id":"a","dp_size":4000000000,"dp_rank":3999999999}"#,
            r#"{"worker_id":"a","dp_size":50000000}"#,
            r#"{"worker_id":"a","dp_size":1025,"dp_rank":1024}"#,
            r#"{"worker_id":"a","dp_size":0}"#,
        ] {
            let e = t.push(&s, &ev(body), 0).unwrap_err();
            assert!(matches!(e, PushError::Invalid(_)), "{body}: {e}");
        }
        assert!(t.workers.is_empty());
        let body = r#"{"worker_id":"a","dp_size":1024,"dp_rank":1023,"kv_used_blocks":1}"#;
        assert_eq!(t.push(&s, &ev(body), 0), Ok(1));
        assert_eq!(t.workers.values().next().map(|w| w.ranks.len()), Some(1024));
    }

    #[test]
    fn effective_is_max_over_fresh_sources_and_missing_is_unknown() {
        let s = snap("load_sources = [\"push\", \"scrape\", \"tracked\"]");
        let cfg = &s.workers[0].cfg;
        let mut w = WorkerLoad::default();
        let r = w.rank_mut(0);
        r.push.active_prefill_tokens = Some(Timed { value: 10, at: 0 });
        r.tracked.active_prefill_tokens = Some(Timed { value: 30, at: 0 });
        r.scrape.kv_used_blocks = Some(Timed { value: 5, at: 0 });
        let e = w.effective(0, cfg, 0, 1000);
        assert_eq!(e.active_prefill_tokens, Some(30));
        assert_eq!(e.kv_used_blocks, Some(5));
        assert_eq!(e.active_decode_blocks, None);
        assert_eq!(e.kv_total_blocks, Some(100));
        // Tracked is instant: it never ages out; push does.
        let e = w.effective(0, cfg, 5000, 1000);
        assert_eq!(e.active_prefill_tokens, Some(30));
        assert_eq!(e.kv_used_blocks, None);
    }

    #[test]
    fn reported_capacity_overrides_config() {
        let s = snap("");
        let mut t = LoadTable::default();
        t.push(
            &s,
            &ev(r#"{"worker_id":"a","kv_total_blocks":1000,"active_decode_blocks":60}"#),
            0,
        )
        .unwrap();
        assert!(!busy_after(&s, &t, 0).is_busy(Class::Standard, s.models[0].members[0].id));
    }
}
