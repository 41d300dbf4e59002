//! The adaptive mode on the monitor: per worker a measurement window over the first
//! tokens the cores saw (their per-core TTFT cells), per member of an adaptive model the
//! factor on its thresholds, stepped by `shed::Adaptive` each time the worker's window
//! closes. Allocates only when the configuration grows.

use crate::shed::window_closes;
use crate::state::Snapshot;

/// One worker's open window: the totals when it opened.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    ttft_us: u64,
    first_tokens: u64,
    opened_ms: u64,
}

#[derive(Debug, Default)]
pub struct Adaptivity {
    /// By worker slot.
    windows: Vec<Option<Window>>,
    /// By worker slot: the mean TTFT (ms) of the window that closed in this step, `Some(None)`
    /// when it closed without a first token, `None` when it did not close.
    closed: Vec<Option<Option<f64>>>,
    /// By member id; absent means 1.
    scales: Vec<f64>,
}

impl Adaptivity {
    /// The factor on member `member`'s thresholds.
    pub fn scale(&self, member: u32) -> f64 {
        self.scales.get(member as usize).copied().unwrap_or(1.0)
    }

    /// Closes the windows due at `now` and steps the members of adaptive models on those
    /// workers; members of other models go back to 1. Returns whether a scale changed.
    pub fn step(&mut self, snap: &Snapshot, now: u64) -> bool {
        if snap.config.models.iter().all(|m| m.adaptive.is_none()) {
            // No adaptive model: no window to keep (one opens when a model turns adaptive)
            // and every factor is 1.
            let changed = self.scales.iter().any(|&s| s != 1.0);
            self.scales.clear();
            self.windows.clear();
            self.closed.clear();
            return changed;
        }
        self.close_windows(snap, now);
        let mut changed = false;
        for (model, cfg) in snap.models.iter().zip(&snap.config.models) {
            for m in model.members.iter() {
                let slot = snap.workers[m.worker as usize].state.slot as usize;
                let (i, old) = (m.id as usize, self.scale(m.id));
                let new = match (cfg.adaptive, self.closed.get(slot).copied().flatten()) {
                    (Some(a), Some(mean)) => a.next_scale(old, mean),
                    (Some(_), None) => old,
                    (None, _) => 1.0,
                };
                if new != old {
                    if self.scales.len() <= i {
                        self.scales.resize(i + 1, 1.0);
                    }
                    self.scales[i] = new;
                    changed = true;
                }
            }
        }
        changed
    }

    fn close_windows(&mut self, snap: &Snapshot, now: u64) {
        self.closed.iter_mut().for_each(|c| *c = None);
        for w in snap.workers.iter() {
            let slot = w.state.slot as usize;
            if self.windows.len() <= slot {
                self.windows.resize(slot + 1, None);
                self.closed.resize(slot + 1, None);
            }
            let (ttft_us, first_tokens) = w.state.ttft_totals();
            let fresh = Window {
                ttft_us,
                first_tokens,
                opened_ms: now,
            };
            let Some(open) = self.windows[slot] else {
                self.windows[slot] = Some(fresh);
                continue;
            };
            let samples = first_tokens.wrapping_sub(open.first_tokens);
            if window_closes(samples, open.opened_ms, now) {
                let sum_us = ttft_us.wrapping_sub(open.ttft_us);
                let mean_ms = (samples > 0).then(|| sum_us as f64 / samples as f64 / 1000.0);
                self.closed[slot] = Some(mean_ms);
                self.windows[slot] = Some(fresh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::config::{Config, Overrides};

    fn snap(adaptive: bool) -> Snapshot {
        let text = format!(
            "[[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 100\n{}\
             [[models.workers]]\nurl = \"http://127.0.0.1:1\"\nname = \"w\"\n",
            if adaptive {
                "adaptive_ttft_ms = 20\n"
            } else {
                ""
            }
        );
        Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), 1).unwrap()
    }

    /// Eight first tokens of `ms` each on the worker's first core.
    fn first_tokens(s: &Snapshot, ms: u64) {
        let cell = &s.workers[0].state.tracked[0];
        cell.ttft_us.fetch_add(8 * ms * 1000, Relaxed);
        cell.first_tokens.fetch_add(8, Relaxed);
    }

    #[test]
    fn a_slow_window_closes_the_scale_and_a_model_no_longer_adaptive_reopens_it() {
        let (on, mut a) = (snap(true), Adaptivity::default());
        let member = on.models[0].members[0].id;
        assert!(!a.step(&on, 0), "the first step only opens the window");
        first_tokens(&on, 40);
        assert!(a.step(&on, 10));
        assert_eq!(a.scale(member), 0.5, "40 ms against 20: halved");
        // The model is no longer adaptive (a reload): back to 1, then nothing to do.
        let off = snap(false);
        assert!(a.step(&off, 20));
        assert_eq!(a.scale(member), 1.0);
        assert!(!a.step(&off, 30));
    }
}
