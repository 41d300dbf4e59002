//! Worker health, decided without I/O (docs/behaviour.md §22). Passive outlier detection
//! reads what the cores saw of each worker's requests; active checks rise and fall as
//! HAProxy's do. An ejected worker leaves rotation for a time that doubles with each
//! ejection, then takes one trial request. A model never loses more than its share of
//! workers to ejection; below its healthy share it routes over all (the panic rule).
//! The monitor owns one [`WorkerHealth`] per worker and calls these steps with `now`.

use serde::Serialize;

pub mod checks;

pub use checks::{CheckKind, CheckSettings};

/// `[outlier]`: passive outlier detection, on by default (Envoy's defaults where Envoy has
/// one).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OutlierSettings {
    pub enabled: bool,
    /// Failures in a row (over all cores, no success between) that eject a worker.
    pub consecutive_failures: u32,
    /// The first ejection's length; each repeat doubles it, up to `max_ejection_ms`.
    pub base_ejection_ms: u64,
    pub max_ejection_ms: u64,
    /// The share of a model's workers that stays in rotation: ejections stop there, and
    /// below it (health checks failing too) the model routes over all its workers.
    pub min_healthy_percent: u8,
    /// The failure-share window.
    pub interval_ms: u64,
    /// A worker whose failure share over the window is this much above its peers' mean
    /// is ejected.
    pub failure_share_above_peers: f64,
    /// Requests a worker (and each peer it is compared with) needs in the window.
    pub request_volume: u64,
}

impl Default for OutlierSettings {
    fn default() -> Self {
        OutlierSettings {
            enabled: true,
            consecutive_failures: 5,
            base_ejection_ms: 30_000,
            max_ejection_ms: 300_000,
            min_healthy_percent: 50,
            interval_ms: 10_000,
            failure_share_above_peers: 0.3,
            request_volume: 20,
        }
    }
}

/// Why a worker was ejected (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EjectReason {
    /// `consecutive_failures` in a row, at least one of them not a failed connect.
    ConsecutiveFailures,
    /// As many failed connects in a row: a passing check ends it, since the worker
    /// accepting connections again is what was missing.
    ConnectFailures,
    /// Its failure share over the window was far above its peers'.
    FailureShare,
    /// Its trial request after an ejection failed.
    FailedTrial,
}

impl EjectReason {
    pub const ALL: [EjectReason; 4] = [
        EjectReason::ConsecutiveFailures,
        EjectReason::ConnectFailures,
        EjectReason::FailureShare,
        EjectReason::FailedTrial,
    ];

    pub fn label(self) -> &'static str {
        match self {
            EjectReason::ConsecutiveFailures => "consecutive_failures",
            EjectReason::ConnectFailures => "connect_failures",
            EjectReason::FailureShare => "failure_share",
            EjectReason::FailedTrial => "failed_trial",
        }
    }
}

/// What a worker's requests ended as, summed over cores since start (monotonic).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Outcomes {
    pub ok: u64,
    pub failed: u64,
    /// Of `failed`, the failed connects.
    pub connect_failed: u64,
}

impl Outcomes {
    fn since(self, earlier: Outcomes) -> Outcomes {
        Outcomes {
            ok: self.ok.wrapping_sub(earlier.ok),
            failed: self.failed.wrapping_sub(earlier.failed),
            connect_failed: self.connect_failed.wrapping_sub(earlier.connect_failed),
        }
    }

    fn add(&mut self, d: Outcomes) {
        self.ok = self.ok.wrapping_add(d.ok);
        self.failed = self.failed.wrapping_add(d.failed);
        self.connect_failed = self.connect_failed.wrapping_add(d.connect_failed);
    }

    fn total(self) -> u64 {
        self.ok.saturating_add(self.failed)
    }
}

/// Where a worker stands with passive detection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Ejection {
    #[default]
    InRotation,
    Ejected {
        until_ms: u64,
        reason: EjectReason,
    },
    /// The ejection ran out: one request may try the worker (half-open).
    Trial {
        since_ms: u64,
    },
}

/// What a step changed, for the monitor to log, count and publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Wants ejecting (the monitor applies the model's cap, then [`WorkerHealth::eject`]).
    EjectDue(EjectReason),
    TrialOpened,
    /// Back in rotation: its trial request succeeded, or a check passed.
    Returned,
    CheckFell,
    CheckRose,
}

/// One worker's health as the monitor keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerHealth {
    /// The outcomes folded in so far.
    #[serde(skip)]
    seen: Outcomes,
    /// Failures in a row, and how many of them were failed connects.
    pub streak: u32,
    #[serde(skip)]
    streak_connect: u32,
    /// The current failure-share window.
    pub window: Outcomes,
    /// Ejections that still count towards the next one's length.
    pub ejections: u32,
    pub ejection: Ejection,
    /// When it last came back, or when its count of ejections last went down.
    #[serde(skip)]
    calm_since_ms: u64,
    /// Active checks: up, and the passes or failures in a row.
    pub check_up: bool,
    #[serde(skip)]
    rises: u32,
    #[serde(skip)]
    falls: u32,
}

impl Default for WorkerHealth {
    fn default() -> Self {
        WorkerHealth {
            seen: Outcomes::default(),
            streak: 0,
            streak_connect: 0,
            window: Outcomes::default(),
            ejections: 0,
            ejection: Ejection::InRotation,
            calm_since_ms: 0,
            check_up: true,
            rises: 0,
            falls: 0,
        }
    }
}

impl WorkerHealth {
    /// A worker first seen now, with the outcomes its cells already hold.
    pub fn new(outcomes: Outcomes) -> WorkerHealth {
        WorkerHealth {
            seen: outcomes,
            ..WorkerHealth::default()
        }
    }

    /// Out of rotation by passive detection (ejected, or waiting for its trial).
    pub fn ejected(&self) -> bool {
        self.ejection != Ejection::InRotation
    }

    /// Out of rotation, by ejection or a failing check.
    pub fn unhealthy(&self) -> bool {
        self.ejected() || !self.check_up
    }

    /// Folds in the outcomes counted since the last step and moves the worker along:
    /// a trial ends, an ejection runs out, a streak calls for an ejection.
    pub fn step(&mut self, outcomes: Outcomes, now: u64, s: &OutlierSettings) -> Option<Change> {
        let d = outcomes.since(self.seen);
        self.seen = outcomes;
        self.window.add(d);
        // The order of outcomes within one step is not known: a success in it ends the
        // streak, so a worker that mixes both is never ejected for a streak.
        if d.ok > 0 {
            (self.streak, self.streak_connect) = (0, 0);
        } else {
            self.streak = self.streak.saturating_add(d.failed as u32);
            self.streak_connect = self.streak_connect.saturating_add(d.connect_failed as u32);
        }
        match self.ejection {
            Ejection::Ejected { until_ms, .. } if now >= until_ms => {
                self.ejection = Ejection::Trial { since_ms: now };
                Some(Change::TrialOpened)
            }
            Ejection::Ejected { .. } => None,
            Ejection::Trial { .. } if d.ok > 0 => {
                self.back(now);
                Some(Change::Returned)
            }
            Ejection::Trial { .. } if d.failed > 0 => {
                Some(Change::EjectDue(EjectReason::FailedTrial))
            }
            Ejection::Trial { .. } => None,
            Ejection::InRotation => {
                if self.ejections > 0 && now.saturating_sub(self.calm_since_ms) >= s.max_ejection_ms
                {
                    self.ejections -= 1;
                    self.calm_since_ms = now;
                }
                let reason = if self.streak_connect >= self.streak {
                    EjectReason::ConnectFailures
                } else {
                    EjectReason::ConsecutiveFailures
                };
                (s.enabled && self.streak >= s.consecutive_failures.max(1))
                    .then_some(Change::EjectDue(reason))
            }
        }
    }

    /// Ejects the worker; returns for how long (ms): the base, doubled for each
    /// ejection that still counts, at most the cap.
    pub fn eject(&mut self, reason: EjectReason, now: u64, s: &OutlierSettings) -> u64 {
        self.ejections = self.ejections.saturating_add(1);
        let ms = s
            .base_ejection_ms
            .saturating_mul(1u64 << (self.ejections - 1).min(30))
            .min(s.max_ejection_ms.max(s.base_ejection_ms));
        self.ejection = Ejection::Ejected {
            until_ms: now.saturating_add(ms),
            reason,
        };
        (self.streak, self.streak_connect) = (0, 0);
        ms
    }

    /// The failure-share window ended: starts the next.
    pub fn next_window(&mut self) {
        self.window = Outcomes::default();
    }

    fn back(&mut self, now: u64) {
        self.ejection = Ejection::InRotation;
        self.calm_since_ms = now;
        (self.streak, self.streak_connect) = (0, 0);
    }

    /// One active check's result. A check that passes brings the worker up after `rise`
    /// passes in a row, and ends an ejection for failed connects (any ejection when the
    /// check is a canary, a real generation); one that fails takes it down after `fall`
    /// failures in a row, or at once when `suspect` (its requests stalled).
    pub fn checked(
        &mut self,
        passed: bool,
        suspect: bool,
        now: u64,
        s: &CheckSettings,
    ) -> Option<Change> {
        if passed {
            (self.rises, self.falls) = (self.rises.saturating_add(1), 0);
            let ends_ejection = match self.ejection {
                Ejection::InRotation => false,
                Ejection::Ejected { reason, .. } => {
                    reason == EjectReason::ConnectFailures || s.kind == CheckKind::Canary
                }
                Ejection::Trial { .. } => s.kind == CheckKind::Canary,
            };
            if ends_ejection && self.check_up {
                self.back(now);
                return Some(Change::Returned);
            }
            if !self.check_up && self.rises >= s.rise.max(1) {
                self.check_up = true;
                if ends_ejection {
                    self.back(now);
                }
                return Some(Change::CheckRose);
            }
            None
        } else {
            (self.rises, self.falls) = (0, self.falls.saturating_add(1));
            if self.check_up && (suspect || self.falls >= s.fall.max(1)) {
                self.check_up = false;
                return Some(Change::CheckFell);
            }
            None
        }
    }
}

/// How many of `n` workers may be ejected at once: those beyond the healthy share.
pub fn max_ejected(n: usize, min_healthy_percent: u8) -> usize {
    n - (n * usize::from(min_healthy_percent.min(100))).div_ceil(100)
}

/// Whether a model with `healthy` of `n` workers in rotation is below its healthy share,
/// and so routes over all of them.
pub fn panics(n: usize, healthy: usize, min_healthy_percent: u8) -> bool {
    n > 0 && healthy * 100 < n * usize::from(min_healthy_percent.min(100))
}

/// The members whose failure share over the window is `failure_share_above_peers` above
/// the mean of their peers' (members and peers with `request_volume` requests each).
/// `windows[i]` is member i's window; returns a bit per member (the first 64).
pub fn share_outliers(windows: &[Outcomes], s: &OutlierSettings) -> u64 {
    let share = |w: &Outcomes| w.failed as f64 / w.total().max(1) as f64;
    let judged = |w: &Outcomes| w.total() >= s.request_volume.max(1);
    let (count, sum) = windows
        .iter()
        .filter(|w| judged(w))
        .fold((0usize, 0.0), |(c, sum), w| (c + 1, sum + share(w)));
    let mut out = 0u64;
    for (i, w) in windows.iter().enumerate().take(64) {
        if !judged(w) || count < 2 {
            continue;
        }
        let peers_mean = (sum - share(w)) / (count - 1) as f64;
        if share(w) >= peers_mean + s.failure_share_above_peers {
            out |= 1 << i;
        }
    }
    out
}

#[cfg(test)]
mod tests;
