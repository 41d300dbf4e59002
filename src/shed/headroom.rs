//! A worker's headroom (docs/behaviour.md §3.12, the prefill room): what a core needs to see the worker busy by what it routed there
//! itself since the busy set was evaluated, without waiting for the monitor to fold its
//! tracked load in: the prefill it routed, and the requests it has in flight over the
//! engine's slots. Between two folds (`monitor_interval_ms`) a burst of arrivals would
//! otherwise all find the worker "not busy" and land in one engine step (or in its
//! queue). Dynamo's router likewise counts its own routing at once. Pure.

use super::{Class, Knob, Thresholds, Why};

/// The worker's tracked prefill tokens as the evaluation saw them, and per class the
/// prefill limit (tokens) and the knob that sets it; the engine's slots and per class the
/// waiting-requests limit. Only the `tracked` source is extended this way: a pushed or
/// scraped figure cannot know what was routed since.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Headroom {
    pub tracked: u64,
    /// The worker's `max_num_batched_tokens` (the fractional limit's unit), 0 if unknown.
    pub max_batched: u64,
    /// By [`Class::index`]; `None`: no prefill threshold, nothing to check.
    pub limit: [Option<(u64, Knob)>; 3],
    /// The engine's slots (requests it runs at once), 0 if unknown.
    pub slots: u64,
    /// By [`Class::index`]: `waiting_requests_threshold`; `None`: nothing to check.
    pub waiting: [Option<u64>; 3],
}

/// The most prefill tokens a rank may carry before thresholds `t` make it busy, and the
/// knob that says so: the lower of the absolute and the fractional limit (compared as
/// [`super::rank_why`] compares them).
pub fn prefill_limit(t: &Thresholds, max_batched: Option<u64>) -> Option<(u64, Knob)> {
    let abs = t
        .active_prefill_tokens_threshold
        .map(|l| (l, Knob::PrefillTokens));
    let frac = match (t.active_prefill_tokens_threshold_frac, max_batched) {
        (Some(f), Some(m)) => Some(((f * m as f64) as u64, Knob::PrefillTokensFrac)),
        _ => None,
    };
    match (abs, frac) {
        (Some(a), Some(f)) => Some(if f.0 < a.0 { f } else { a }),
        (a, f) => a.or(f),
    }
}

impl Headroom {
    /// The room of a worker whose tracked prefill is `tracked`, under each class's
    /// thresholds `by_class`; none (the default) without a prefill threshold, so that the
    /// tracked figure alone never changes a busy set.
    pub fn new(tracked: u64, max_batched: Option<u64>, by_class: &[Thresholds; 3]) -> Self {
        let limit = by_class.each_ref().map(|t| prefill_limit(t, max_batched));
        if limit == [None; 3] {
            return Headroom::default();
        }
        Headroom {
            tracked,
            max_batched: max_batched.unwrap_or(0),
            limit,
            ..Headroom::default()
        }
    }

    /// The room with the waiting-requests check of an engine with `slots` slots (none
    /// when the slots are unknown or no class has the threshold).
    pub fn with_slots(mut self, slots: Option<u64>, by_class: &[Thresholds; 3]) -> Self {
        let waiting = by_class.each_ref().map(|t| t.waiting_requests_threshold);
        if let Some(slots) = slots.filter(|&s| s > 0 && waiting != [None; 3]) {
            (self.slots, self.waiting) = (slots, waiting);
        }
        self
    }

    /// Why a request of `class` finds the worker busy when `bound` requests are on their
    /// way to its engine or in it (Spillway's own, live): with this one sent, those
    /// beyond its slots would wait in the engine's queue, more than the limit (`None`:
    /// not busy by that, or nothing to check). So a limit of 0 sends no request to wait.
    pub fn waiting_why(&self, class: Class, bound: u64) -> Option<Why> {
        let limit = self.waiting[class.index()]?;
        let waiting = bound.saturating_add(1).saturating_sub(self.slots);
        (waiting > limit).then_some(Why {
            knob: Knob::WaitingRequests,
            value: waiting as f64,
            threshold: limit as f64,
        })
    }

    /// Whether a core has anything to check for `class`.
    #[inline]
    pub fn checks_waiting(&self, class: Class) -> bool {
        self.waiting[class.index()].is_some()
    }

    /// Why a request of `class` finds the worker busy once this core has routed `routed`
    /// prefill tokens to it since the evaluation (`None`: not busy by that).
    pub fn why(&self, class: Class, routed: u64) -> Option<Why> {
        let (limit, knob) = self.limit[class.index()]?;
        let tokens = self.tracked.saturating_add(routed);
        if routed == 0 || tokens <= limit {
            return None;
        }
        let (value, threshold) = match knob {
            Knob::PrefillTokensFrac if self.max_batched > 0 => {
                let max = self.max_batched as f64;
                (tokens as f64 / max, limit as f64 / max)
            }
            _ => (tokens as f64, limit as f64),
        };
        Some(Why {
            knob,
            value,
            threshold,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(abs: Option<u64>, frac: Option<f64>) -> Thresholds {
        Thresholds {
            active_decode_blocks_threshold: Some(0.9),
            active_prefill_tokens_threshold: abs,
            active_prefill_tokens_threshold_frac: frac,
            waiting_requests_threshold: None,
        }
    }

    /// Requests beyond the engine's slots wait there: busy past the threshold, per class;
    /// nothing to check without slots or a threshold.
    #[test]
    fn requests_beyond_the_slots_wait() {
        let (std, shed) = (Class::Standard, Class::Sheddable);
        let mut by_class = [t(None, None); 3];
        by_class[std.index()].waiting_requests_threshold = Some(0);
        by_class[shed.index()].waiting_requests_threshold = Some(2);
        let room = Headroom::default().with_slots(Some(4), &by_class);
        assert!(room.checks_waiting(std) && !room.checks_waiting(Class::Critical));
        assert_eq!(room.waiting_why(std, 3), None, "a slot is free for it");
        let why = room
            .waiting_why(std, 4)
            .map(|w| (w.knob, w.value, w.threshold));
        assert_eq!(
            why,
            Some((Knob::WaitingRequests, 1.0, 0.0)),
            "it would wait"
        );
        assert_eq!(
            room.waiting_why(shed, 5),
            None,
            "two would wait: at the limit"
        );
        assert!(room.waiting_why(shed, 6).is_some());
        assert_eq!(room.waiting_why(Class::Critical, 1000), None);
        assert_eq!(
            Headroom::default().with_slots(None, &by_class),
            Headroom::default()
        );
        assert_eq!(
            Headroom::default().with_slots(Some(4), &[t(None, None); 3]),
            Headroom::default()
        );
    }

    #[test]
    fn the_lower_prefill_limit_binds() {
        // (absolute, fraction, max_num_batched_tokens, limit)
        let cases = [
            (None, None, Some(2048), None),
            (Some(512), None, None, Some((512, Knob::PrefillTokens))),
            (None, Some(0.5), None, None),
            (
                None,
                Some(0.5),
                Some(2048),
                Some((1024, Knob::PrefillTokensFrac)),
            ),
            (
                Some(512),
                Some(0.5),
                Some(2048),
                Some((512, Knob::PrefillTokens)),
            ),
            (
                Some(2000),
                Some(0.5),
                Some(2048),
                Some((1024, Knob::PrefillTokensFrac)),
            ),
        ];
        for (abs, frac, max, want) in cases {
            assert_eq!(
                prefill_limit(&t(abs, frac), max),
                want,
                "{abs:?} {frac:?} {max:?}"
            );
        }
    }

    #[test]
    fn what_a_core_routed_makes_the_worker_busy_past_the_limit() {
        let (crit, std, shed) = (Class::Critical, Class::Standard, Class::Sheddable);
        let mut by_class = [t(None, None); 3];
        by_class[std.index()] = t(Some(1000), None);
        by_class[shed.index()] = t(Some(500), None);
        let room = Headroom::new(300, Some(2048), &by_class);
        assert_eq!(
            room.why(std, 0),
            None,
            "nothing routed: the monitor's word stands"
        );
        assert_eq!(room.why(std, 700), None, "at the limit is not over it");
        let why = room.why(std, 701).map(|w| (w.knob, w.value, w.threshold));
        assert_eq!(why, Some((Knob::PrefillTokens, 1001.0, 1000.0)));
        assert!(
            room.why(shed, 201).is_some(),
            "a lower limit is crossed sooner"
        );
        assert_eq!(room.why(crit, u64::MAX), None, "no prefill threshold");
        let none = Headroom::new(300, Some(2048), &[t(None, None); 3]);
        assert_eq!(
            none,
            Headroom::default(),
            "no prefill threshold: no room to carry"
        );
        let frac = Headroom::new(0, Some(2048), &[t(None, Some(0.25)); 3]);
        let why = frac.why(std, 1024).map(|w| (w.knob, w.value, w.threshold));
        assert_eq!(why, Some((Knob::PrefillTokensFrac, 0.5, 0.25)));
    }
}
