//! The busy rule (docs/behaviour.md §3) as pure code: thresholds, per-rank checks with the decode
//! latch, and the all-ranks aggregation. No I/O, no clock: the monitor feeds it values.

mod adaptive;
mod class;
mod headroom;

use serde::{Deserialize, Serialize};

pub use adaptive::{Adaptive, SHARE_WINDOW_MS, overloaded, window_closes};
pub use class::Class;
pub use headroom::Headroom;

/// A model's busy thresholds; each unset by default, each enabling only its own check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    pub active_decode_blocks_threshold: Option<f64>,
    pub active_prefill_tokens_threshold: Option<u64>,
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// Busy when the engine has more requests waiting than this (its own queue: vLLM
    /// `num_requests_waiting`, SGLang `num_queue_reqs`, llama.cpp `requests_deferred`, a
    /// pushed `num_requests_waiting`, or Spillway's own requests over the engine's slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_requests_threshold: Option<u64>,
}

impl Thresholds {
    /// Whether any check is configured (busy workers are excluded only then).
    pub fn any(&self) -> bool {
        self.active_decode_blocks_threshold.is_some()
            || self.active_prefill_tokens_threshold.is_some()
            || self.active_prefill_tokens_threshold_frac.is_some()
            || self.waiting_requests_threshold.is_some()
    }

    /// Dynamo's validation messages, verbatim.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(v) = self
            .active_decode_blocks_threshold
            .filter(|v| !(v.is_finite() && (0.0..=1.0).contains(v)))
        {
            return Err(format!(
                "active_decode_blocks_threshold must be between 0.0 and 1.0, got {v}"
            ));
        }
        if let Some(v) = self
            .active_prefill_tokens_threshold_frac
            .filter(|v| !(v.is_finite() && *v >= 0.0))
        {
            return Err(format!(
                "active_prefill_tokens_threshold_frac must be a finite value greater than or equal to 0.0, got {v}"
            ));
        }
        Ok(())
    }

    /// Partial merge: fields set in `update` replace ours, unset ones keep ours.
    pub fn merged(&self, update: &Thresholds) -> Thresholds {
        Thresholds {
            active_decode_blocks_threshold: update
                .active_decode_blocks_threshold
                .or(self.active_decode_blocks_threshold),
            active_prefill_tokens_threshold: update
                .active_prefill_tokens_threshold
                .or(self.active_prefill_tokens_threshold),
            active_prefill_tokens_threshold_frac: update
                .active_prefill_tokens_threshold_frac
                .or(self.active_prefill_tokens_threshold_frac),
            waiting_requests_threshold: update
                .waiting_requests_threshold
                .or(self.waiting_requests_threshold),
        }
    }
}

/// One rank's effective load and capacity; `None` = unknown (never read as zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RankLoad {
    pub active_decode_blocks: Option<u64>,
    pub kv_used_blocks: Option<u64>,
    pub active_prefill_tokens: Option<u64>,
    pub kv_total_blocks: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    /// Requests waiting in the engine's own queue.
    pub waiting_requests: Option<u64>,
}

/// What refused a request (Dynamo's admission-controls direction: every refusal names
/// its knob). The busy rule's three thresholds, the worker's admission limits, a request
/// class's share of the slots, the worker's own refusal, and nothing reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Knob {
    DecodeBlocks,
    PrefillTokens,
    PrefillTokensFrac,
    WaitingRequests,
    QueueFull,
    QueueTimeout,
    ClassShare,
    /// The client's stated budget ended its wait for a slot.
    Deadline,
    /// A more important request took its place in the model's full waiting room.
    Evicted,
    /// Its tenant holds its share of the model's waiting room already.
    TenantShare,
    UpstreamOverloaded,
    Unreachable,
}

impl Knob {
    pub const ALL: [Knob; 12] = [
        Knob::DecodeBlocks,
        Knob::PrefillTokens,
        Knob::PrefillTokensFrac,
        Knob::WaitingRequests,
        Knob::QueueFull,
        Knob::QueueTimeout,
        Knob::ClassShare,
        Knob::Deadline,
        Knob::Evicted,
        Knob::TenantShare,
        Knob::UpstreamOverloaded,
        Knob::Unreachable,
    ];

    /// The metrics label and the `knob` field of refusal bodies.
    pub fn label(self) -> &'static str {
        match self {
            Knob::DecodeBlocks => "decode_blocks",
            Knob::PrefillTokens => "prefill_tokens",
            Knob::PrefillTokensFrac => "prefill_tokens_frac",
            Knob::WaitingRequests => "waiting_requests",
            Knob::QueueFull => "queue_full",
            Knob::QueueTimeout => "queue_timeout",
            Knob::ClassShare => "class_share",
            Knob::Deadline => "deadline",
            Knob::Evicted => "evicted",
            Knob::TenantShare => "tenant_share",
            Knob::UpstreamOverloaded => "upstream_overloaded",
            Knob::Unreachable => "unreachable",
        }
    }

    /// The setting that tunes it (the `setting` field of refusal bodies).
    pub fn setting(self) -> &'static str {
        match self {
            Knob::DecodeBlocks => "active_decode_blocks_threshold",
            Knob::PrefillTokens => "active_prefill_tokens_threshold",
            Knob::PrefillTokensFrac => "active_prefill_tokens_threshold_frac",
            Knob::WaitingRequests => "waiting_requests_threshold",
            Knob::QueueFull => "engine_request_limit + request_queue_limit",
            Knob::QueueTimeout => "request_queue_timeout_ms",
            Knob::ClassShare => "classes.<class>.slot_share",
            Knob::Deadline => "the client's x-stainless-timeout or client_budget_header",
            Knob::Evicted => "waiting_room_size",
            Knob::TenantShare => "tenant_room_share",
            Knob::UpstreamOverloaded => "the worker's own limits",
            Knob::Unreachable => "the model's workers (down after failed connects)",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why a rank (or worker) is busy: the knob that fired, the measured value and its
/// threshold, in the knob's unit (a fraction of capacity, or tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Why {
    pub knob: Knob,
    pub value: f64,
    pub threshold: f64,
}

impl Why {
    /// How far over its threshold (1.0 = at it); the least-busy member of a pool is the
    /// one with the lowest.
    pub fn excess(&self) -> f64 {
        if self.threshold > 0.0 {
            self.value / self.threshold
        } else {
            f64::INFINITY
        }
    }
}

/// Evaluates one rank. `latch` is the rank's decode latch, updated in place: set when either
/// decode signal is above the threshold, cleared only when every present one is at or below.
pub fn rank_busy(t: &Thresholds, load: &RankLoad, latch: &mut bool) -> bool {
    rank_why(t, load, latch).is_some()
}

/// As [`rank_busy`], saying which check fired first (decode, prefill, prefill fraction,
/// waiting requests) and with what value.
pub fn rank_why(t: &Thresholds, load: &RankLoad, latch: &mut bool) -> Option<Why> {
    let decode = decode_why(t, load, latch);
    let prefill = match (
        t.active_prefill_tokens_threshold,
        load.active_prefill_tokens,
    ) {
        (Some(limit), Some(tokens)) if tokens > limit => Some(Why {
            knob: Knob::PrefillTokens,
            value: tokens as f64,
            threshold: limit as f64,
        }),
        _ => None,
    };
    let frac = match (
        t.active_prefill_tokens_threshold_frac,
        load.max_num_batched_tokens,
        load.active_prefill_tokens,
    ) {
        (Some(frac), Some(max), Some(tokens)) if tokens > (frac * max as f64) as u64 => Some(Why {
            knob: Knob::PrefillTokensFrac,
            value: if max > 0 {
                tokens as f64 / max as f64
            } else {
                f64::INFINITY
            },
            threshold: frac,
        }),
        _ => None,
    };
    let waiting = match (t.waiting_requests_threshold, load.waiting_requests) {
        (Some(limit), Some(waiting)) if waiting > limit => Some(Why {
            knob: Knob::WaitingRequests,
            value: waiting as f64,
            threshold: limit as f64,
        }),
        _ => None,
    };
    decode.or(prefill).or(frac).or(waiting)
}

/// The decode check, with its latch.
fn decode_why(t: &Thresholds, load: &RankLoad, latch: &mut bool) -> Option<Why> {
    let (Some(frac), Some(total)) = (t.active_decode_blocks_threshold, load.kv_total_blocks) else {
        *latch = false;
        return None;
    };
    if total == 0 {
        *latch = false;
        return None;
    }
    let limit = frac * total as f64;
    let signals = [load.kv_used_blocks, load.active_decode_blocks];
    if signals.iter().flatten().any(|&used| used as f64 > limit) {
        *latch = true;
    } else if signals.iter().flatten().all(|&used| used as f64 <= limit) {
        *latch = false;
    }
    let used = signals.iter().flatten().max().copied().unwrap_or(0);
    latch.then(|| Why {
        knob: Knob::DecodeBlocks,
        value: used as f64 / total as f64,
        threshold: frac,
    })
}

/// A worker is busy only when it has ranks and every one of them is busy.
pub fn worker_busy(ranks: impl IntoIterator<Item = bool>) -> bool {
    let mut any = false;
    for busy in ranks {
        if !busy {
            return false;
        }
        any = true;
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const fn t(decode: Option<f64>, abs: Option<u64>, frac: Option<f64>) -> Thresholds {
        Thresholds {
            active_decode_blocks_threshold: decode,
            active_prefill_tokens_threshold: abs,
            active_prefill_tokens_threshold_frac: frac,
            waiting_requests_threshold: None,
        }
    }

    const fn waiting(limit: Option<u64>, waiting: Option<u64>) -> (Thresholds, RankLoad) {
        let mut th = t(None, None, None);
        th.waiting_requests_threshold = limit;
        let mut l = load(None, None, None, None, None);
        l.waiting_requests = waiting;
        (th, l)
    }

    const fn load(
        decode: Option<u64>,
        used: Option<u64>,
        prefill: Option<u64>,
        total: Option<u64>,
        max: Option<u64>,
    ) -> RankLoad {
        RankLoad {
            active_decode_blocks: decode,
            kv_used_blocks: used,
            active_prefill_tokens: prefill,
            kv_total_blocks: total,
            max_num_batched_tokens: max,
            waiting_requests: None,
        }
    }

    /// The busy rule, case by case: thresholds, a rank's load, whether it is busy.
    const TABLE: &[(Thresholds, RankLoad, bool)] = &[
        (
            t(None, None, None),
            load(Some(1000), Some(1000), Some(1 << 30), Some(10), Some(1)),
            false,
        ),
        (
            t(Some(0.85), None, None),
            load(Some(86), None, None, Some(100), None),
            true,
        ),
        (
            t(Some(0.85), None, None),
            load(Some(85), None, None, Some(100), None),
            false,
        ),
        (
            t(Some(0.85), None, None),
            load(None, Some(86), None, Some(100), None),
            true,
        ),
        (
            t(Some(0.85), None, None),
            load(Some(99), None, None, None, None),
            false,
        ),
        (
            t(Some(0.85), None, None),
            load(Some(99), None, None, Some(0), None),
            false,
        ),
        (
            t(Some(0.0), None, None),
            load(Some(1), None, None, Some(100), None),
            true,
        ),
        (
            t(Some(0.0), None, None),
            load(Some(0), None, None, Some(100), None),
            false,
        ),
        (
            t(None, Some(100), None),
            load(None, None, Some(101), None, None),
            true,
        ),
        (
            t(None, Some(100), None),
            load(None, None, Some(100), None, None),
            false,
        ),
        (
            t(None, Some(100), None),
            load(None, None, None, None, None),
            false,
        ),
        (
            t(None, None, Some(0.5)),
            load(None, None, Some(51), None, Some(100)),
            true,
        ),
        (
            t(None, None, Some(0.5)),
            load(None, None, Some(50), None, Some(100)),
            false,
        ),
        (
            t(None, None, Some(2.0)),
            load(None, None, Some(201), None, Some(100)),
            true,
        ),
        (
            t(None, None, Some(0.5)),
            load(None, None, Some(1 << 40), None, None),
            false,
        ),
        (
            t(Some(0.9), Some(10), None),
            load(Some(1), None, Some(11), Some(100), None),
            true,
        ),
    ];

    #[test]
    fn table() {
        for (i, (th, l, want)) in TABLE.iter().enumerate() {
            let mut latch = false;
            assert_eq!(rank_busy(th, l, &mut latch), *want, "case {i}");
        }
    }

    /// The waiting-requests check: busy only above the threshold, never on an unknown
    /// figure, and 0 means any waiting request makes the rank busy.
    #[test]
    fn waiting_requests() {
        for (limit, queued, busy) in [
            (Some(0), Some(1), true),
            (Some(0), Some(0), false),
            (Some(4), Some(4), false),
            (Some(4), Some(5), true),
            (Some(0), None, false),
            (None, Some(100), false),
        ] {
            let (th, l) = waiting(limit, queued);
            let mut latch = false;
            let why = rank_why(&th, &l, &mut latch);
            assert_eq!(why.is_some(), busy, "{limit:?} {queued:?}");
            if let Some(why) = why {
                assert_eq!(why.knob, Knob::WaitingRequests);
                assert_eq!(
                    (why.value, why.threshold),
                    (queued.unwrap() as f64, limit.unwrap() as f64)
                );
            }
        }
        assert!(waiting(Some(3), None).0.any());
    }

    #[test]
    fn the_first_check_that_fires_says_why() {
        let mut latch = false;
        let why = rank_why(
            &t(Some(0.5), Some(10), None),
            &load(Some(60), None, Some(20), Some(100), None),
            &mut latch,
        )
        .unwrap();
        assert_eq!(
            (why.knob, why.value, why.threshold),
            (Knob::DecodeBlocks, 0.6, 0.5)
        );
        let why = rank_why(
            &t(None, Some(10), Some(0.5)),
            &load(None, None, Some(20), None, Some(30)),
            &mut latch,
        )
        .unwrap();
        assert_eq!((why.knob, why.value), (Knob::PrefillTokens, 20.0));
        let why = rank_why(
            &t(None, None, Some(0.5)),
            &load(None, None, Some(20), None, Some(30)),
            &mut latch,
        )
        .unwrap();
        assert_eq!(why.knob, Knob::PrefillTokensFrac);
        assert!((why.value - 2.0 / 3.0).abs() < 1e-9 && why.excess() > 1.0);
        for (i, k) in Knob::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
    }

    #[test]
    fn latch_holds_until_every_signal_is_below() {
        let th = t(Some(0.5), None, None);
        let mut latch = false;
        // Push reports 60 used blocks (busy); tracked says 10: latch set by either.
        assert!(rank_busy(
            &th,
            &load(Some(10), Some(60), None, Some(100), None),
            &mut latch
        ));
        // One publisher drops to 10 while the other still reports 60: stays busy.
        assert!(rank_busy(
            &th,
            &load(Some(60), Some(10), None, Some(100), None),
            &mut latch
        ));
        // Both at or below: clears.
        assert!(!rank_busy(
            &th,
            &load(Some(50), Some(10), None, Some(100), None),
            &mut latch
        ));
        assert!(!latch);
    }

    #[test]
    fn validation_messages() {
        assert_eq!(
            t(Some(1.5), None, None).validate(),
            Err("active_decode_blocks_threshold must be between 0.0 and 1.0, got 1.5".into())
        );
        assert_eq!(
            t(None, None, Some(-0.5)).validate(),
            Err("active_prefill_tokens_threshold_frac must be a finite value greater than or equal to 0.0, got -0.5".into())
        );
        assert!(t(Some(f64::NAN), None, None).validate().is_err());
        assert!(t(None, None, Some(f64::INFINITY)).validate().is_err());
        assert!(t(Some(0.0), Some(0), Some(3.0)).validate().is_ok());
    }

    #[test]
    fn aggregation() {
        assert!(!worker_busy([]));
        assert!(worker_busy([true]));
        assert!(!worker_busy([true, false]));
        assert!(worker_busy([true, true, true]));
    }

    proptest! {
        /// With no thresholds nothing is ever busy.
        #[test]
        fn unset_never_busy(d in any::<Option<u64>>(), u in any::<Option<u64>>(), p in any::<Option<u64>>(),
                            tot in any::<Option<u64>>(), m in any::<Option<u64>>()) {
            let mut latch = false;
            prop_assert!(!rank_busy(&Thresholds::default(), &load(d, u, p, tot, m), &mut latch));
        }

        /// Busy is monotone in load: more prefill tokens never make a busy rank free.
        #[test]
        fn monotone_in_prefill(abs in 0u64..10_000, frac in 0.0f64..4.0, max in 1u64..100_000,
                               a in 0u64..100_000, extra in 0u64..100_000) {
            let th = t(None, Some(abs), Some(frac));
            let (mut l1, mut l2) = (false, false);
            let lo = rank_busy(&th, &load(None, None, Some(a), None, Some(max)), &mut l1);
            let hi = rank_busy(&th, &load(None, None, Some(a + extra), None, Some(max)), &mut l2);
            prop_assert!(!lo || hi);
        }

        /// Decode check agrees with the formula `used > t * total` (fresh latch).
        #[test]
        fn decode_formula(frac in 0.0f64..=1.0, total in 1u64..1_000_000, used in 0u64..1_000_000) {
            let mut latch = false;
            let busy = rank_busy(&t(Some(frac), None, None), &load(Some(used), None, None, Some(total), None), &mut latch);
            prop_assert_eq!(busy, used as f64 > frac * total as f64);
        }

        /// A worker is busy iff all of its (at least one) ranks are.
        #[test]
        fn all_ranks(ranks in proptest::collection::vec(any::<bool>(), 0..16)) {
            prop_assert_eq!(worker_busy(ranks.iter().copied()), !ranks.is_empty() && ranks.iter().all(|b| *b));
        }
    }
}
