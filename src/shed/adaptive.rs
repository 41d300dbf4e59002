//! The adaptive mode (Envoy's adaptive concurrency, Dynamo's learned limits): the operator
//! sets a TTFT target instead of tuning token thresholds by hand; each worker's busy
//! thresholds are scaled between configured bounds so that its admitted requests' mean
//! time to first token stays near the target.
//!
//! The target binds under overload only. A model that refuses few of its requests is near
//! capacity: every refusal there is goodput lost (the engines had room for it a moment
//! later), while the engine slots already bound its TTFT; so there the thresholds close
//! only past [`NEAR_CAPACITY_SLACK`] times the target. A model that refuses a large share
//! ([`OVERLOAD_SHARE`] over a [`SHARE_WINDOW_MS`] window) is overloaded: the requests beyond
//! capacity are refused whatever the thresholds, and the admitted ones' TTFT is what is
//! left to protect, so the target binds. Pure: the monitor feeds it one window of
//! measurements at a time.

use serde::Serialize;

/// A window closes after this many first tokens...
pub const WINDOW_SAMPLES: u64 = 8;
/// ...or this long after it opened, whichever comes first.
pub const WINDOW_MAX_MS: u64 = 1_000;
/// The most one window may open the thresholds up (a gentle climb) or close them (a
/// fast retreat), as a factor.
const MAX_RISE: f64 = 1.1;
const MAX_FALL: f64 = 0.5;
/// Near capacity the thresholds open faster: a refusal there is goodput lost, and a model
/// that refuses little risks little by opening (after a start, the configured thresholds
/// reach four times themselves in 4 windows instead of 15).
const CALM_MAX_RISE: f64 = 1.5;

/// A model becomes overloaded when it refuses at least this share of its requests in a
/// window, and stops being so below [`CALM_SHARE`] (hysteresis: a model near the line does
/// not flap between targets).
pub const OVERLOAD_SHARE: f64 = 0.2;
pub const CALM_SHARE: f64 = 0.1;
/// The window over which a model's refused share is measured.
pub const SHARE_WINDOW_MS: u64 = 1_000;
/// Not overloaded, TTFT may reach this many times the target before thresholds close.
pub const NEAR_CAPACITY_SLACK: f64 = 2.0;
/// Overloaded, a request waits in a worker's queue at most this share of the target
/// (CoDel's idea, as in Facebook's RPC queues: a queue that stays full only adds delay, so
/// under overload its waits are cut short; near capacity it absorbs bursts).
pub const OVERLOAD_QUEUE_SHARE: f64 = 0.1;

/// A model's adaptive settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Adaptive {
    /// Mean TTFT (as clients see it, queue wait included) to hold each worker at.
    pub ttft_ms: f64,
    /// Bounds of the factor on the model's thresholds.
    pub min_scale: f64,
    pub max_scale: f64,
}

impl Adaptive {
    pub const DEFAULT_MIN_SCALE: f64 = 0.25;
    pub const DEFAULT_MAX_SCALE: f64 = 4.0;

    /// The scale after a window whose requests' mean TTFT was `mean_ms` (`None`: no first
    /// token in the window, so nothing says the worker is slow): the gradient
    /// `target / measured`, at most ×0.5 down per window and ×1.1 up, within the bounds.
    /// The target is `ttft_ms` when the model is `overloaded`, else
    /// [`NEAR_CAPACITY_SLACK`] times it, approached at up to ×1.5 a window.
    pub fn next_scale(&self, scale: f64, mean_ms: Option<f64>, overloaded: bool) -> f64 {
        let (target, rise) = if overloaded {
            (self.ttft_ms, MAX_RISE)
        } else {
            (self.ttft_ms * NEAR_CAPACITY_SLACK, CALM_MAX_RISE)
        };
        let gradient = match mean_ms {
            Some(m) if m > 0.0 => (target / m).clamp(MAX_FALL, rise),
            _ => rise,
        };
        (scale * gradient).clamp(self.min_scale, self.max_scale)
    }

    /// The cap on a request's wait in a worker's queue while the model is overloaded, in
    /// ms: [`OVERLOAD_QUEUE_SHARE`] of the target, at least 1.
    pub fn overload_queue_cap_ms(&self) -> u64 {
        (self.ttft_ms * OVERLOAD_QUEUE_SHARE).ceil().max(1.0) as u64
    }
}

/// Whether a model is overloaded after a window in which it refused `refused` of the
/// `routed` requests it got, given whether it was before.
pub fn overloaded(was: bool, routed: u64, refused: u64) -> bool {
    if routed == 0 {
        return false;
    }
    let share = refused as f64 / routed as f64;
    share >= if was { CALM_SHARE } else { OVERLOAD_SHARE }
}

/// Whether a window opened at `opened_ms` with `samples` first tokens closes at `now_ms`.
pub fn window_closes(samples: u64, opened_ms: u64, now_ms: u64) -> bool {
    samples >= WINDOW_SAMPLES || now_ms.saturating_sub(opened_ms) >= WINDOW_MAX_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Adaptive = Adaptive {
        ttft_ms: 50.0,
        min_scale: 0.25,
        max_scale: 4.0,
    };

    /// (scale, window mean TTFT, overloaded, next scale).
    const STEPS: &[(f64, Option<f64>, bool, f64)] = &[
        (1.0, Some(50.0), true, 1.0),   // on target: hold
        (1.0, Some(25.0), true, 1.1),   // fast: climb, gently
        (1.0, None, true, 1.1),         // no first token: climb
        (1.0, Some(62.5), true, 0.8),   // 25 % slow: close by the gradient
        (1.0, Some(500.0), true, 0.5),  // far too slow: at most halve
        (0.3, Some(500.0), true, 0.25), // never below the bound
        (3.9, Some(1.0), true, 4.0),    // never above it
        // Near capacity the target is twice as far, and the climb faster.
        (1.0, Some(62.5), false, 1.5), // slow for the target, fine near capacity: climb
        (1.0, Some(80.0), false, 1.25), // by the gradient
        (1.0, None, false, 1.5),       // no first token: climb
        (1.0, Some(100.0), false, 1.0), // at twice the target: hold
        (1.0, Some(125.0), false, 0.8), // past it: close
        (3.0, Some(10.0), false, 4.0), // never above the bound
    ];

    #[test]
    fn the_gradient_steps_within_bounds() {
        for &(scale, mean, overloaded, want) in STEPS {
            let got = A.next_scale(scale, mean, overloaded);
            assert!(
                (got - want).abs() < 1e-9,
                "{scale} {mean:?} {overloaded}: {got} != {want}"
            );
        }
    }

    #[test]
    fn overloaded_queue_waits_are_capped_at_a_tenth_of_the_target() {
        assert_eq!(A.overload_queue_cap_ms(), 5);
        let fast = Adaptive { ttft_ms: 4.0, ..A };
        assert_eq!(fast.overload_queue_cap_ms(), 1, "never 0");
        let odd = Adaptive { ttft_ms: 55.0, ..A };
        assert_eq!(odd.overload_queue_cap_ms(), 6, "rounded up");
    }

    #[test]
    fn overload_starts_at_a_fifth_refused_and_ends_below_a_tenth() {
        // (was, routed, refused, is)
        let cases = [
            (false, 0, 0, false),
            (false, 100, 19, false),
            (false, 100, 20, true),
            (true, 100, 10, true),
            (true, 100, 9, false),
            (true, 0, 0, false),
        ];
        for (was, routed, refused, want) in cases {
            assert_eq!(
                overloaded(was, routed, refused),
                want,
                "{was} {routed} {refused}"
            );
        }
    }

    #[test]
    fn windows_close_on_samples_or_age() {
        assert!(!window_closes(7, 0, 999));
        assert!(window_closes(8, 0, 1));
        assert!(window_closes(0, 0, 1000));
        assert!(
            !window_closes(0, 2000, 1000),
            "a clock behind the window never closes it"
        );
    }
}
