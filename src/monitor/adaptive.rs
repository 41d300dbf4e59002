//! The adaptive mode on the monitor: per worker a measurement window over the first
//! tokens the cores saw (their per-core TTFT cells), per adaptive model a window over the
//! requests it got and refused (whether it is overloaded), per member of an adaptive model
//! the factor on its thresholds, stepped by `shed::Adaptive` each time the worker's window
//! closes. Allocates only when the configuration grows.

use crate::shed::{Class, Knob, SHARE_WINDOW_MS, overloaded, window_closes};
use crate::state::{Model, Snapshot};

/// One worker's open window: the totals when it opened.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    ttft_us: u64,
    first_tokens: u64,
    opened_ms: u64,
}

/// One adaptive model's open window over its requests: the totals when it opened.
#[derive(Debug, Clone, Copy, Default)]
struct ShareWindow {
    routed: u64,
    refused: u64,
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
    /// By model id: the open window over its requests, and whether the last one that
    /// closed found it overloaded.
    shares: Vec<Option<ShareWindow>>,
    overloaded: Vec<bool>,
}

/// A model's requests routed and refused for overload (any knob but "no worker
/// reachable"), summed over cores and classes.
fn request_totals(m: &Model) -> (u64, u64) {
    let routed = Class::ALL.iter().map(|&c| m.metrics.requests_of_class(c));
    let refused = Knob::ALL
        .iter()
        .filter(|&&k| k != Knob::Unreachable)
        .flat_map(|&k| Class::ALL.map(|c| m.metrics.refusals(k, c)));
    (
        routed.fold(0, u64::wrapping_add),
        refused.fold(0, u64::wrapping_add),
    )
}

impl Adaptivity {
    /// The factor on member `member`'s thresholds.
    pub fn scale(&self, member: u32) -> f64 {
        self.scales.get(member as usize).copied().unwrap_or(1.0)
    }

    /// Whether the adaptive model `model` (its id) is overloaded (see `shed::adaptive`).
    pub fn is_overloaded(&self, model: u32) -> bool {
        self.overloaded
            .get(model as usize)
            .copied()
            .unwrap_or(false)
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
            self.shares.clear();
            self.overloaded.clear();
            return changed;
        }
        self.close_windows(snap, now);
        self.close_shares(snap, now);
        let mut changed = false;
        for (model, cfg) in snap.models.iter().zip(&snap.config.models) {
            for m in model.members.iter() {
                let slot = snap.workers[m.worker as usize].state.slot as usize;
                let (i, old) = (m.id as usize, self.scale(m.id));
                let new = match (cfg.adaptive, self.closed.get(slot).copied().flatten()) {
                    (Some(a), Some(mean)) => a.next_scale(old, mean, self.is_overloaded(model.id)),
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

    /// Closes the adaptive models' request windows due at `now`: each says whether its
    /// model is overloaded until the next closes.
    fn close_shares(&mut self, snap: &Snapshot, now: u64) {
        for (model, cfg) in snap.models.iter().zip(&snap.config.models) {
            let i = model.id as usize;
            if self.shares.len() <= i {
                self.shares.resize(i + 1, None);
                self.overloaded.resize(i + 1, false);
            }
            if cfg.adaptive.is_none() {
                (self.shares[i], self.overloaded[i]) = (None, false);
                continue;
            }
            let open = self.shares[i];
            if open.is_some_and(|w| now.saturating_sub(w.opened_ms) < SHARE_WINDOW_MS) {
                continue;
            }
            // The counters are summed over cores only when a window closes (once a second).
            let (routed, refused) = request_totals(model);
            if let Some(w) = open {
                let got = routed.wrapping_sub(w.routed);
                let shed = refused.wrapping_sub(w.refused);
                self.overloaded[i] = overloaded(self.overloaded[i], got, shed);
            }
            self.shares[i] = Some(ShareWindow {
                routed,
                refused,
                opened_ms: now,
            });
        }
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
    use crate::shed::{Class, Knob};

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
        first_tokens(&on, 80);
        assert!(a.step(&on, 10));
        assert_eq!(
            a.scale(member),
            0.5,
            "80 ms against 40 (near capacity: twice the 20 ms target): halved"
        );
        // The model is no longer adaptive (a reload): back to 1, then nothing to do.
        let off = snap(false);
        assert!(a.step(&off, 20));
        assert_eq!(a.scale(member), 1.0);
        assert!(!a.step(&off, 30));
    }

    #[test]
    fn a_model_refusing_a_fifth_is_overloaded_and_its_target_binds() {
        let (s, mut a) = (snap(true), Adaptivity::default());
        let (model, member) = (s.models[0].id, s.models[0].members[0].id);
        let cells = &s.models[0].metrics.cores[0];
        a.step(&s, 0);
        // Near capacity: 30 ms against a 20 ms target is within twice it, so it climbs by
        // the gradient (40 / 30).
        first_tokens(&s, 30);
        a.step(&s, 10);
        assert!(!a.is_overloaded(model));
        let near = 40.0 / 30.0;
        assert!((a.scale(member) - near).abs() < 1e-9, "{}", a.scale(member));
        // A window in which 30 of 100 requests were refused.
        for i in 0..100 {
            cells.classed(Class::Standard);
            if i % 10 < 3 {
                cells.refused(Knob::PrefillTokens, Class::Standard);
            }
        }
        a.step(&s, 999);
        assert!(!a.is_overloaded(model), "the window is not over yet");
        a.step(&s, 1000);
        assert!(a.is_overloaded(model));
        // Overloaded: 30 ms against 20 closes the scale by the gradient.
        first_tokens(&s, 30);
        a.step(&s, 1010);
        assert!(
            (a.scale(member) - near * 20.0 / 30.0).abs() < 1e-9,
            "{}",
            a.scale(member)
        );
        // A quiet window (nothing refused): no longer overloaded.
        for _ in 0..100 {
            cells.classed(Class::Standard);
        }
        a.step(&s, 2000);
        assert!(!a.is_overloaded(model));
    }
}
