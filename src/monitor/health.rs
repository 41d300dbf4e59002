//! The monitor's side of worker health (docs/behaviour.md §22): every tick it folds in
//! what the cores counted of each worker's attempts, ejects and returns workers by the
//! rules of `crate::health`, caps ejections at each model's healthy share, and writes
//! who is out of rotation (and which models panic) into the busy set it publishes.
//! Active checks' results arrive through [`HealthTable::checked`].

use serde::Serialize;

use crate::health::checks::CheckResult;
use crate::health::{Change, EjectReason, Ejection, Outcomes, OutlierSettings, WorkerHealth};
use crate::health::{max_ejected, panics, share_outliers};
use crate::state::{BusySet, Member, SlotMap, SlotSet, Snapshot, Worker};

/// Health of every worker, and what /metrics counts of it.
#[derive(Debug, Default)]
pub struct HealthTable {
    workers: SlotMap<WorkerHealth>,
    /// When the failure-share window began: the first pass starts the first one.
    window_start_ms: Option<u64>,
    /// A model's members' windows while they are judged; sized once per generation, so
    /// a judgment allocates nothing.
    windows: Vec<Outcomes>,
    /// The snapshot generation `workers` was last trimmed to.
    generation: u64,
    /// Per worker slot: ejections by [`EjectReason::ALL`] order, checks by
    /// [`CheckResult::ALL`] order.
    pub ejections: SlotMap<[u64; 4]>,
    pub checks: SlotMap<[u64; 3]>,
    /// Per model id: ejections the healthy share refused.
    pub refused_ejections: SlotMap<u64>,
    /// Workers whose ejection the share refuses now (logged once each time it starts).
    capped: SlotSet,
}

/// One worker's health as `GET /workers` shows it.
#[derive(Debug, Serialize)]
pub struct WorkerView<'a> {
    pub name: &'a str,
    pub healthy: bool,
    pub suspect: bool,
    #[serde(flatten)]
    pub health: &'a WorkerHealth,
}

impl HealthTable {
    /// The health pass: folds in outcomes, ejects and returns, and writes the health
    /// bits into `out`. Returns whether `out` changed.
    pub fn pass(&mut self, snap: &Snapshot, now: u64, out: &mut BusySet) -> bool {
        let s = snap.config.outlier;
        if self.generation != snap.generation {
            self.generation = snap.generation;
            let live: SlotSet = snap.workers.iter().map(|w| w.state.slot).collect();
            self.workers.retain(|slot, _| live.contains(slot));
            let widest = snap.models.iter().map(|m| m.members.len()).max();
            self.windows.reserve(widest.unwrap_or(0));
        }
        let mut due: Vec<(usize, EjectReason)> = Vec::new();
        for (i, w) in snap.workers.iter().enumerate() {
            let outcomes = w.state.outcomes();
            let h = (self.workers)
                .entry(w.state.slot)
                .or_insert_with(|| WorkerHealth::new(outcomes));
            let provisional = w.state.take_provisional() && !h.ejected();
            match h.step(outcomes, now, &s) {
                Some(Change::EjectDue(reason)) => due.push((i, reason)),
                _ if provisional => due.push((i, EjectReason::ConsecutiveFailures)),
                Some(Change::TrialOpened) => {
                    w.state.set_trial(true);
                    tracing::info!(worker = %w.cfg.name, "ejection over: one trial request may try the worker");
                }
                Some(Change::Returned) => returned(w, "its trial request succeeded"),
                _ => reopen_stuck_trial(h, w, now, &s),
            }
        }
        let start = *self.window_start_ms.get_or_insert(now);
        if now.saturating_sub(start) >= s.interval_ms {
            self.window_start_ms = Some(now);
            self.judge_shares(snap, &s, &mut due);
        }
        for (i, reason) in due {
            self.eject(snap, i, reason, now);
        }
        self.write(snap, out)
    }

    /// The failure-share window ended: an outlier among its model's peers is due.
    fn judge_shares(
        &mut self,
        snap: &Snapshot,
        s: &OutlierSettings,
        due: &mut Vec<(usize, EjectReason)>,
    ) {
        if s.enabled {
            for m in snap.models.iter() {
                let mut windows = std::mem::take(&mut self.windows);
                windows.clear();
                let of_member = |mm: &Member| self.of(&snap.workers[mm.worker as usize]).window;
                windows.extend(m.members.iter().map(of_member));
                let outliers = share_outliers(&windows, s);
                self.windows = windows;
                for (pos, mm) in m.members.iter().enumerate().take(64) {
                    let i = mm.worker as usize;
                    let in_rotation = !self.of(&snap.workers[i]).ejected();
                    if outliers & (1 << pos) != 0 && in_rotation && !due.iter().any(|d| d.0 == i) {
                        due.push((i, EjectReason::FailureShare));
                    }
                }
            }
        }
        self.workers
            .values_mut()
            .for_each(WorkerHealth::next_window);
    }

    fn of(&self, w: &Worker) -> &WorkerHealth {
        static NONE: std::sync::LazyLock<WorkerHealth> =
            std::sync::LazyLock::new(WorkerHealth::default);
        self.workers.get(&w.state.slot).unwrap_or(&NONE)
    }

    /// Ejects worker `i` unless a model of its would keep fewer than its healthy share
    /// (a failed trial's worker is out of rotation already, so it always may).
    fn eject(&mut self, snap: &Snapshot, i: usize, reason: EjectReason, now: u64) {
        let s = snap.config.outlier;
        let w = &snap.workers[i];
        let slot = w.state.slot;
        if reason != EjectReason::FailedTrial {
            let over = snap.models.iter().find(|m| {
                let mut members = m.members.iter().map(|mm| &snap.workers[mm.worker as usize]);
                let ejected = members.clone().filter(|x| self.of(x).ejected()).count();
                members.any(|x| x.state.slot == slot)
                    && ejected + 1 > max_ejected(m.members.len(), s.min_healthy_percent)
            });
            if let Some(m) = over {
                *self.refused_ejections.entry(m.id).or_default() += 1;
                if self.capped.insert(slot) {
                    tracing::warn!(worker = %w.cfg.name, model = %m.name, reason = reason.label(), min_healthy_percent = s.min_healthy_percent, "worker failing but not ejected: the model would keep fewer than its healthy share");
                }
                return;
            }
        }
        self.capped.remove(&slot);
        let Some(h) = self.workers.get_mut(&slot) else {
            return;
        };
        let ms = h.eject(reason, now, &s);
        w.state.set_trial(false);
        let k = EjectReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.ejections.entry(slot).or_default()[k] += 1;
        let ejections = h.ejections;
        tracing::warn!(worker = %w.cfg.name, reason = reason.label(), ejection_ms = ms, ejections, "worker ejected");
    }

    /// Writes each worker's health bit and each model's panic bit; returns whether any
    /// changed. Logs a model entering or leaving panic.
    fn write(&self, snap: &Snapshot, out: &mut BusySet) -> bool {
        let pct = snap.config.outlier.min_healthy_percent;
        let mut changed = false;
        for w in snap.workers.iter() {
            changed |= out.set_unhealthy(w.state.slot, self.of(w).unhealthy());
        }
        for m in snap.models.iter() {
            let workers = m.members.iter().map(|mm| &snap.workers[mm.worker as usize]);
            let healthy = workers
                .filter(|w| !self.of(w).unhealthy() && !w.state.is_suspect())
                .count();
            let panic = panics(m.members.len(), healthy, pct);
            if out.set_panic(m.id, panic) {
                changed = true;
                let n = m.members.len();
                if panic {
                    tracing::warn!(model = %m.name, healthy, workers = n, min_healthy_percent = pct, "too few healthy workers: routing over all of them, health ignored");
                } else {
                    tracing::info!(model = %m.name, healthy, workers = n, "enough healthy workers again: health applies");
                }
            }
        }
        changed
    }

    /// One active check's result for worker `i` (the check loop). Returns whether the
    /// worker's health changed.
    pub fn checked(&mut self, snap: &Snapshot, i: usize, result: CheckResult, now: u64) -> bool {
        let Some(w) = snap.workers.get(i) else {
            return false;
        };
        let Some(settings) = checks_of(snap, i) else {
            return false;
        };
        let slot = w.state.slot;
        let k = CheckResult::ALL
            .iter()
            .position(|r| *r == result)
            .unwrap_or(0);
        self.checks.entry(slot).or_default()[k] += 1;
        let passed = result == CheckResult::Passed;
        let suspect = w.state.is_suspect();
        if passed {
            w.state.check_passed(now);
            w.state.mark_up();
        }
        let h = (self.workers)
            .entry(slot)
            .or_insert_with(|| WorkerHealth::new(w.state.outcomes()));
        match h.checked(passed, suspect, now, settings) {
            Some(Change::Returned) => returned(w, "a check passed"),
            Some(Change::CheckRose) => {
                tracing::warn!(worker = %w.cfg.name, kind = settings.kind.label(), "worker's checks pass again: back in rotation");
            }
            Some(Change::CheckFell) => {
                let why = if suspect {
                    "its requests stalled and a check failed"
                } else {
                    "its checks failed"
                };
                tracing::warn!(worker = %w.cfg.name, kind = settings.kind.label(), result = result.label(), why, "worker out of rotation");
            }
            _ => return passed && suspect,
        }
        true
    }

    /// Each worker's health, for the admin API.
    pub fn view<'a>(&'a self, snap: &'a Snapshot) -> Vec<WorkerView<'a>> {
        snap.workers
            .iter()
            .map(|w| {
                let health = self.of(w);
                WorkerView {
                    name: &w.cfg.name,
                    healthy: !health.unhealthy() && !w.state.is_suspect(),
                    suspect: w.state.is_suspect(),
                    health,
                }
            })
            .collect()
    }

    /// Whether worker `slot` is ejected now (the `spillway_worker_ejected` gauge).
    pub fn is_ejected(&self, slot: u32) -> bool {
        self.workers.get(&slot).is_some_and(WorkerHealth::ejected)
    }
}

/// The checks of worker `i`: those of the first of its models that has any.
pub fn checks_of(snap: &Snapshot, i: usize) -> Option<&crate::health::CheckSettings> {
    let worker = u32::try_from(i).ok()?;
    let serves = |m: &&crate::state::Model| m.members.iter().any(|mm| mm.worker == worker);
    snap.models.iter().filter(serves).find_map(|m| {
        let cfg = snap.config.models.iter().find(|c| *c.name == *m.name)?;
        cfg.health_check.as_ref()
    })
}

fn returned(w: &Worker, how: &str) {
    w.state.set_trial(false);
    tracing::warn!(worker = %w.cfg.name, how, "worker back in rotation");
}

/// A trial request that was taken but never came back (its client left, say) leaves the
/// trial open again after an interval.
fn reopen_stuck_trial(h: &mut WorkerHealth, w: &Worker, now: u64, s: &OutlierSettings) {
    if let Ejection::Trial { since_ms } = h.ejection
        && !w.state.trial_open()
        && now.saturating_sub(since_ms) >= s.interval_ms
    {
        h.ejection = Ejection::Trial { since_ms: now };
        w.state.set_trial(true);
    }
}
