//! The adaptive mode (Envoy's adaptive concurrency, Dynamo's learned limits): the operator
//! sets a TTFT target instead of tuning token thresholds by hand; each worker's busy
//! thresholds are scaled between configured bounds so that its admitted requests' mean
//! time to first token stays near the target. Near capacity the thresholds open up
//! (fewer refusals while TTFT is fine); under overload they close (TTFT held). Pure: the
//! monitor feeds it one window of measurements at a time.

use serde::Serialize;

/// A window closes after this many first tokens...
pub const WINDOW_SAMPLES: u64 = 8;
/// ...or this long after it opened, whichever comes first.
pub const WINDOW_MAX_MS: u64 = 1_000;
/// The most one window may open the thresholds up (a gentle climb) or close them (a
/// fast retreat), as a factor.
const MAX_RISE: f64 = 1.1;
const MAX_FALL: f64 = 0.5;

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
    /// `target / measured`, at most ×1.1 up and ×0.5 down per window, within the bounds.
    pub fn next_scale(&self, scale: f64, mean_ms: Option<f64>) -> f64 {
        let gradient = match mean_ms {
            Some(m) if m > 0.0 => (self.ttft_ms / m).clamp(MAX_FALL, MAX_RISE),
            _ => MAX_RISE,
        };
        (scale * gradient).clamp(self.min_scale, self.max_scale)
    }
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

    /// (scale, window mean TTFT, next scale).
    const STEPS: &[(f64, Option<f64>, f64)] = &[
        (1.0, Some(50.0), 1.0),   // on target: hold
        (1.0, Some(25.0), 1.1),   // fast: climb, gently
        (1.0, None, 1.1),         // no first token: climb
        (1.0, Some(62.5), 0.8),   // 25 % slow: close by the gradient
        (1.0, Some(500.0), 0.5),  // far too slow: at most halve
        (0.3, Some(500.0), 0.25), // never below the bound
        (3.9, Some(1.0), 4.0),    // never above it
    ];

    #[test]
    fn the_gradient_steps_within_bounds() {
        for &(scale, mean, want) in STEPS {
            let got = A.next_scale(scale, mean);
            assert!(
                (got - want).abs() < 1e-9,
                "{scale} {mean:?}: {got} != {want}"
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
